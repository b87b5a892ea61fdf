"""The OpenAI-compatible HTTP layer, split by job: request bodies (body), request fields
(params), text out of token ids (text), JSON shapes (render), errors (errors). `engine.server.http`
wires them to aiohttp routes and streams. Nothing here touches tensors."""
