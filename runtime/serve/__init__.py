"""`ninfer serve`: the OpenAI- and Anthropic-compatible HTTP server (Sanic) over the engine.

`server.run(config)` is the process entry point; `app.create_app(service)` builds the Sanic app
for a loaded `service.Service`. docs/serve.md is the user guide.
"""
