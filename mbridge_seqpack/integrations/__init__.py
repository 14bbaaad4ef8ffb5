"""Ways to turn the plugin on where users launch, without code: the environment variable and its startup hook."""
