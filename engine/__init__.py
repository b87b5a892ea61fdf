"""tfengine: a small Qwen3-family inference engine with lanes, stepped prompts and a lane host."""
