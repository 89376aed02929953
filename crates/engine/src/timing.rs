//! Step timing: how long one engine step takes, from the shape of its batch.

use crate::profile::{Polynomial, Roofline};

/// What a step computes, summed over its batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepShape {
    /// Prompt tokens computed (uncached), over all prefill chunks.
    pub prefill_tokens: u64,
    /// Attention work of the prefill chunks: sum of `chunk * (cached + chunk / 2)`.
    pub prefill_attention: f64,
    /// Context tokens the prefill chunks attend to (cached + chunk), read from KV.
    pub prefill_context: u64,
    /// Sequences decoding one token.
    pub decode_seqs: u64,
    /// Sum of the decoding sequences' contexts.
    pub decode_context: u64,
    /// Fraction of the KV cache in use, 0..=1.
    pub kv_usage: f64,
}

impl StepShape {
    /// True when the step does nothing.
    pub fn is_empty(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_seqs == 0
    }
}

/// A step-timing model.
#[derive(Clone, Debug, PartialEq)]
pub enum StepModel {
    /// Compute or bandwidth bound, whichever is slower, plus overhead.
    Roofline(Roofline),
    /// Polynomials of the uncached tokens and the KV usage.
    Polynomial(Polynomial),
}

impl StepModel {
    /// Whether a step's time depends on its decoding sequences' contexts: when not, decode
    /// steps of the same sequences at the same KV usage all take the same time.
    pub fn uses_decode_context(&self) -> bool {
        match self {
            StepModel::Roofline(_) => true,
            StepModel::Polynomial(_) => false,
        }
    }

    /// Seconds the step takes (0 for an empty step).
    pub fn step_secs(&self, s: &StepShape) -> f64 {
        if s.is_empty() {
            return 0.0;
        }
        match self {
            StepModel::Roofline(r) => {
                let attn = 4.0 * f64::from(r.layers) * f64::from(r.heads) * f64::from(r.head_dim);
                let flops =
                    2.0 * r.params_billion * 1e9 * (s.prefill_tokens + s.decode_seqs) as f64
                        + attn * (s.prefill_attention + s.decode_context as f64);
                let kv_bytes =
                    r.kv_bytes_per_token() * (s.prefill_context + s.decode_context) as f64;
                let bw = r.hbm_tb_per_s * 1e12;
                let compute = flops / (r.peak_tflops * 1e12 * r.mfu);
                let memory = r.weight_bytes() / (bw * r.mbu)
                    + kv_bytes / (bw * r.attention_mbu.unwrap_or(r.mbu));
                let allreduce = r.allreduce_secs((s.prefill_tokens + s.decode_seqs) as f64);
                compute.max(memory) + allreduce + r.step_overhead_ms / 1e3
            }
            StepModel::Polynomial(p) => {
                let mut ms = 0.0;
                if s.prefill_tokens > 0 {
                    let t = s.prefill_tokens as f64;
                    ms += p.prefill_ms[0] + p.prefill_ms[1] * t + p.prefill_ms[2] * t * t;
                }
                if s.decode_seqs > 0 {
                    let u = s.kv_usage.clamp(0.0, 1.0);
                    let d = p.decode_ms[0] + p.decode_ms[1] * u + p.decode_ms[2] * u * u;
                    ms += d.max(p.decode_floor_ms);
                }
                ms.max(0.0) / 1e3
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Profile;

    #[test]
    fn mocker_polynomial_matches_its_published_curves() {
        let m = Profile::builtin("mocker-poly").unwrap().step_model();
        let prefill = StepShape {
            prefill_tokens: 1_000,
            ..StepShape::default()
        };
        assert!((m.step_secs(&prefill) * 1e3 - 32.105_858_9).abs() < 1e-6);
        let decode = StepShape {
            decode_seqs: 10,
            kv_usage: 0.5,
            ..StepShape::default()
        };
        assert!((m.step_secs(&decode) * 1e3 - 26.31).abs() < 1e-9);
        let both = StepShape {
            prefill_tokens: 1_000,
            ..decode
        };
        assert!((m.step_secs(&both) * 1e3 - (32.105_858_9 + 26.31)).abs() < 1e-6);
        assert_eq!(m.step_secs(&StepShape::default()), 0.0);
        let longer = StepShape {
            decode_context: 10_000,
            ..decode
        };
        assert!(!m.uses_decode_context());
        assert_eq!(m.step_secs(&decode), m.step_secs(&longer));
    }

    #[test]
    fn roofline_decode_is_bandwidth_bound_and_prefill_compute_bound() {
        let p = Profile::builtin("h200-llama3-70b-fp8").unwrap();
        let StepModel::Roofline(r) = p.step_model() else {
            panic!("roofline profile")
        };
        let m = StepModel::Roofline(r.clone());
        // One decode step of 32 sequences at 4k context: reading the 70.6 GB of weights
        // dominates; the step is near weights / (bandwidth * mbu) + overhead.
        let decode = StepShape {
            decode_seqs: 32,
            decode_context: 32 * 4_096,
            ..StepShape::default()
        };
        let floor = r.weight_bytes() / (r.hbm_tb_per_s * 1e12 * r.mbu);
        let t = m.step_secs(&decode);
        assert!(t > floor && t < floor * 1.5 + 0.01, "{t} vs {floor}");
        // A 16k-token prefill is compute bound and grows about linearly with tokens.
        let pf = |n: u64| StepShape {
            prefill_tokens: n,
            prefill_attention: n as f64 * n as f64 / 2.0,
            prefill_context: n,
            ..StepShape::default()
        };
        let (a, b) = (m.step_secs(&pf(8_192)), m.step_secs(&pf(16_384)));
        assert!(b > 1.8 * a && b < 2.4 * a, "{a} {b}");
        let longer = StepShape {
            decode_context: 64 * 4_096,
            ..decode
        };
        assert!(m.uses_decode_context());
        assert!(m.step_secs(&longer) > m.step_secs(&decode));
    }
}
