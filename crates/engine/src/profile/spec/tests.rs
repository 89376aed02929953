//! Profiles derived from spec sheets: the calibrated one unchanged, a second setup derived.

use crate::profile::{parse_profiles, Profile, Roofline, BUILTIN_PROFILES};
use crate::timing::{StepModel, StepShape};

/// The roofline `h200-llama3-70b-fp8` was calibrated with, as it was written by hand.
fn calibrated_h200() -> Roofline {
    Roofline {
        params_billion: 70.6,
        layers: 80,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        weight_bytes_per_param: 1.0,
        kv_dtype_bytes: 1.0,
        peak_tflops: 1979.0,
        hbm_tb_per_s: 4.8,
        hbm_gb: 141.0,
        memory_fraction: 0.95,
        mfu: 0.45,
        mbu: 0.85,
        attention_mbu: Some(0.33),
        step_overhead_ms: 1.0,
        tensor_parallel: 1,
        link_gb_per_s: 450.0 * 0.7,
        allreduce_latency_us: 10.0,
    }
}

#[test]
fn the_calibrated_profile_derives_from_its_spec_sheet_unchanged() {
    let p = Profile::builtin("h200-llama3-70b-fp8").unwrap();
    assert_eq!(p.roofline, Some(calibrated_h200()));
    assert_eq!(p.request_overhead_ms, 190.0);
    // 387k tokens of KV in blocks of 32, as calibrated.
    assert_eq!(p.kv_blocks(32), 12_083);
}

#[test]
fn tensor_parallel_adds_up_the_gpus_and_pays_all_reduces() {
    let p = Profile::builtin("h100x2-tp2-llama3-70b-fp8").unwrap();
    let r = p.roofline.clone().unwrap();
    assert_eq!(r.tensor_parallel, 2);
    assert_eq!((r.peak_tflops, r.hbm_gb), (3958.0, 160.0));
    assert!((r.hbm_tb_per_s - 6.7).abs() < 1e-9);
    assert_eq!((r.mfu, r.mbu, r.attention_mbu), (0.45, 0.85, Some(0.33)));
    // A decode step of 64 sequences: 160 all-reduces of 1 MiB, latency bound (1.6 ms of
    // latency plus 0.5 ms of transfer).
    let ar = r.allreduce_secs(64.0);
    assert!((ar - (160.0 * 10e-6 + 160.0 * 64.0 * 8192.0 * 2.0 / 315e9)).abs() < 1e-9);
    let h200 = StepModel::Roofline(calibrated_h200());
    let tp2 = p.step_model();
    let decode = StepShape {
        decode_seqs: 64,
        decode_context: 64 * 4_096,
        ..StepShape::default()
    };
    // Twice the bandwidth of one H100 (1.4x an H200's) reads the weights faster; the
    // all-reduces take part of that back.
    let (a, b) = (h200.step_secs(&decode), tp2.step_secs(&decode));
    assert!(b < a && b > a / 1.4 && b - ar < a / 1.3, "{a} {b}");
    // A 16k-token prefill: twice the FLOP/s, plus 160 all-reduces of 256 MiB.
    let prefill = StepShape {
        prefill_tokens: 16_384,
        prefill_attention: 16_384.0 * 8_192.0,
        prefill_context: 16_384,
        ..StepShape::default()
    };
    let (a, b) = (h200.step_secs(&prefill), tp2.step_secs(&prefill));
    assert!(b > a / 2.0 && b < a / 1.7, "{a} {b}");
}

#[test]
fn a_derived_profile_names_what_it_lacks() {
    let with = |profile: &str| {
        let base = BUILTIN_PROFILES
            .split("\n[profiles.")
            .next()
            .unwrap()
            .to_string()
            + "\n";
        parse_profiles(&(base + profile))
    };
    let ok = "[profiles.x]\nblock_size = 16\nmax_num_seqs = 8\nmax_num_batched_tokens = 64\n\
              [profiles.x.hardware]\ngpu = \"a100-40g\"\ngpus = 1\nmodel = \"qwen3-8b\"\n\
              dtype = \"bf16\"\nmemory_fraction = 0.9\n";
    let p = with(ok).unwrap().remove("x").unwrap();
    assert_eq!(p.roofline.unwrap().peak_tflops, 312.0);
    for (change, says) in [
        (("\"bf16\"", "\"fp8\""), "no FP8"),
        (("\"a100-40g\"", "\"b300\""), "unknown gpu"),
        (("\"qwen3-8b\"", "\"qwen9\""), "unknown model"),
        (("gpus = 1", "gpus = 0"), "gpus must be"),
        (("dtype = \"bf16\"", "dtype = \"fp4\""), "dtype must be"),
        (
            (
                "max_num_batched_tokens = 64\n",
                "max_num_batched_tokens = 64\nrequest_overhead_ms = 5.0\n",
            ),
            "takes its roofline",
        ),
    ] {
        let e = with(&ok.replace(change.0, change.1))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{change:?}: {e}");
    }
    let no_efficiency = BUILTIN_PROFILES.replace("[efficiency]", "[efficiency_gone]");
    assert!(parse_profiles(&no_efficiency).is_err());
}
