"""Megatron-Bridge's own recipe functions built offline, as a regression suite for the rules."""
