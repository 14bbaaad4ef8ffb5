"""Configuration composition: capabilities declared as mixins, every dependent field derived from the final topology.

``mixins`` (the capabilities as facts, ``apply``) and ``derive`` (every field that follows from topology, sequence
length and packing mode); recipes are written with them.
"""
