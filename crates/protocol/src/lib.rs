//! Wire formats spoken with the outside: the OpenAI API (requests, responses, stream chunks,
//! errors), the KV event streams engines publish and the Prometheus metrics text they serve.
//! Decoders here take untrusted bytes: they return errors, never panic, and bound what they
//! allocate.

pub mod kv_events;
pub mod openai;
pub mod plane;
pub mod prometheus_text;
