//! Wire formats spoken with the outside: the KV event streams engines publish. Decoders here
//! take untrusted bytes: they return errors, never panic, and bound what they allocate.

pub mod vllm_events;
