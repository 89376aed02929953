//! Wire formats spoken with the outside: the OpenAI API (requests, responses, stream chunks,
//! errors) and the KV event streams engines publish. Decoders here take untrusted bytes: they
//! return errors, never panic, and bound what they allocate.

pub mod kv_events;
pub mod openai;
pub mod plane;
