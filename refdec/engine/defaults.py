"""The engine's defaults, each stated once: the Python API, the decoding service and the command
line read them here (no torch: ``refdec --help`` reads them too)."""

MAX_NEW_TOKENS = 256  # generate / submit: new tokens at most
PREFIX_CACHE_ENTRIES = 4  # finished requests whose KV entries a backend keeps (refdec.engine.prefix_cache)
MAX_CONCURRENT = 4  # DecodingService: requests decoding together
MAX_WAITING = 64  # DecodingService: requests queued beyond those
