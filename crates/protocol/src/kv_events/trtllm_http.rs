//! TensorRT-LLM's HTTP pull API (`POST /kv_cache_events`): JSON events, drained per call.
