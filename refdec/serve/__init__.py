"""``refdec serve``: a local OpenAI-compatible server that takes OpenAI's Predicted Outputs.

Modules: refdec.serve.app (the routes, over refdec.engine.service.DecodingService: one engine
loop that every request joins), refdec.serve.protocol (request bodies and errors in OpenAI's
shape), refdec.serve.text (tokens to streamed text, stop strings trimmed), refdec.serve.corpora
(named corpora, chosen per request, added and removed at run time). The command line is
refdec.cli.serve; docs/serve.md shows clients. Needs ``pip install 'refdec[serve]'``.
"""
