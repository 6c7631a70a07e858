//! Putting a decoder on its GPU as three named steps: its weights, its KV cache, and a self-test
//! (a short prefill and a one-token decode, compared with the CPU model it was built from).
//! The device announces each step to its backend ([`Gpu::enter`]). A failure names its step,
//! so `--device auto` can serve the model on the CPU saying why and `--device cuda` can fail
//! saying where.

use kernels::gpu::{Gpu, Step};

use super::start::kv_budget;
use super::EngineConfig;
use crate::device::{one_line, DTypeRequest};
use crate::model::{ActivationMode, CausalLm, KvBudget, SeqChunk};
use crate::weight_cache::CachedDevice;

/// A decoder on its GPU, its KV cache allocated and its self-test passed.
pub(super) struct Placed {
    pub model: Box<dyn CausalLm>,
    pub kv_blocks: usize,
}

/// A step that failed, and why (one line).
#[derive(Debug)]
pub(super) struct PlaceError {
    pub step: Step,
    pub why: String,
}

impl std::fmt::Display for PlaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.step, self.why)
    }
}

/// How far the GPU's logits may be from the CPU model's, as ‖gpu − cpu‖ / ‖cpu‖ over the
/// mean-centred logits of one decode step. A 16-bit model lands within a few per cent of the
/// f32 CPU model; a wrong kernel, a missing write or garbage memory lands near or above 1.
const SELF_TEST_TOLERANCE: f32 = 0.15;

/// Tokens of the self-test's prefill; one more token is decoded after them.
const SELF_TEST_PREFILL: usize = 3;

/// Put `host` on `gpu` as `config` asks, leaving `host` as it was (it serves on the CPU if
/// this fails). `cached`: device weights from the weight cache, mapped instead of uploaded.
pub(super) fn place_on_gpu(
    host: &mut dyn CausalLm,
    gpu: &Gpu,
    config: &EngineConfig,
    active: usize,
    cached: Option<CachedDevice>,
) -> Result<Placed, PlaceError> {
    let result = steps(host, gpu, config, active, cached);
    gpu.enter(None);
    result
}

fn fail(step: Step) -> impl Fn(crate::error::EngineError) -> PlaceError {
    move |e| PlaceError {
        step,
        why: one_line(&e),
    }
}

fn steps(
    host: &mut dyn CausalLm,
    gpu: &Gpu,
    config: &EngineConfig,
    active: usize,
    cached: Option<CachedDevice>,
) -> Result<Placed, PlaceError> {
    gpu.enter(Some(Step::Weights));
    let mut model = match cached {
        Some(c) => from_cache(host, gpu, config.dtype, &c),
        None => host.to_gpu(gpu, config.dtype),
    }
    .map_err(fail(Step::Weights))?;
    gpu.enter(Some(Step::KvCache));
    let kv_blocks = model
        .allocate_kv(config.block_size, &kv_budget(config, active))
        .map_err(fail(Step::KvCache))?;
    gpu.enter(Some(Step::SelfTest));
    self_test(host, model.as_mut(), config.block_size, kv_blocks).map_err(|why| PlaceError {
        step: Step::SelfTest,
        why,
    })?;
    Ok(Placed { model, kv_blocks })
}

/// The model over the weight cache's device weights, mapped, not uploaded. When they cannot
/// be mapped, `fallback` uploads from the host model, saying why; without it the weights
/// step fails.
fn from_cache(
    host: &dyn CausalLm,
    gpu: &Gpu,
    dtype: DTypeRequest,
    cached: &CachedDevice,
) -> crate::error::Result<Box<dyn CausalLm>> {
    let mapped = cached
        .map(gpu)
        .and_then(|packed| host.to_gpu_mapped(gpu, dtype, &packed));
    match mapped {
        Ok(model) => {
            tracing::info!(
                device = %gpu.info().label(),
                bytes = cached.bytes(),
                "device weights mapped from the weight cache (nothing uploaded)"
            );
            Ok(model)
        }
        Err(e) if cached.fallback => {
            tracing::warn!(
                device = %gpu.info().label(),
                "the weight cache's device weights cannot be used ({}): uploading from the checkpoint",
                one_line(&e)
            );
            host.to_gpu(gpu, dtype)
        }
        Err(e) => Err(e),
    }
}

/// Prefill a few tokens and decode one on both models, and compare the decode step's logits.
/// The CPU model runs in f32 for it, in a cache of its own that serving replaces.
fn self_test(
    host: &mut dyn CausalLm,
    gpu: &mut dyn CausalLm,
    block_size: usize,
    gpu_blocks: usize,
) -> Result<(), String> {
    let info = host.info().clone();
    let vocab = info.vocab_size as u32;
    if vocab == 0 {
        return Err("the model has an empty vocabulary".into());
    }
    // Ordinary ids spread over the vocabulary, after the BOS a prompt starts with.
    let tokens: Vec<u32> = std::iter::once(info.bos_token_id.unwrap_or(0) % vocab)
        .chain((1..=SELF_TEST_PREFILL as u32).map(|i| vocab / 5 * i % vocab))
        .collect();
    let blocks = tokens.len().div_ceil(block_size.max(1));
    if gpu_blocks < blocks {
        return Err(format!(
            "the KV cache has {gpu_blocks} blocks, fewer than the {blocks} the test needs"
        ));
    }
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mode = host.activation_mode();
    host.set_activation_mode(ActivationMode::F32);
    let want = host
        .allocate_kv(block_size, &KvBudget::tokens(blocks * block_size))
        .map_err(|e| format!("the CPU model's cache: {e}"))
        .and_then(|_| run(host, &tokens, &table).map_err(|e| format!("on the CPU: {e}")));
    host.set_activation_mode(mode);
    let want = want?;
    let got = run(gpu, &tokens, &table).map_err(|e| format!("on the GPU: {e}"))?;
    compare(&got, &want)
}

/// The logits of the last token, decoded alone after the others' prefill.
fn run(model: &mut dyn CausalLm, tokens: &[u32], table: &[u32]) -> crate::error::Result<Vec<f32>> {
    let (prefill, last) = tokens.split_at(tokens.len() - 1);
    let chunk = |tokens, start_pos, want_logits| SeqChunk {
        lora: None,
        tokens,
        start_pos,
        block_table: table,
        want_logits,
        media: None,
    };
    model.forward(&[chunk(prefill, 0, false)])?;
    model
        .forward(&[chunk(last, prefill.len(), true)])?
        .into_iter()
        .next()
        .flatten()
        .ok_or_else(|| crate::error::EngineError::Internal("no logits for the decode step".into()))
}

fn compare(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} logits on the GPU, {} on the CPU",
            got.len(),
            want.len()
        ));
    }
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(format!("logit {i} is {} on the GPU", got[i]));
    }
    let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len().max(1) as f64;
    let (mg, mw) = (mean(got), mean(want));
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (f64::from(g) - mg, f64::from(w) - mw);
        diff += (g - w) * (g - w);
        norm += w * w;
    }
    let rel = (diff / norm.max(f64::MIN_POSITIVE)).sqrt() as f32;
    if rel <= SELF_TEST_TOLERANCE {
        Ok(())
    } else {
        Err(format!(
            "the GPU's logits differ from the CPU model's by {rel:.3} (relative L2; at most {SELF_TEST_TOLERANCE} passes)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::compare;

    #[test]
    fn the_comparison_passes_rounding_and_fails_garbage() {
        let want: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let rounded: Vec<f32> = want
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32() + 0.01)
            .collect();
        assert!(compare(&rounded, &want).is_ok());
        let reversed: Vec<f32> = want.iter().rev().copied().collect();
        assert!(compare(&reversed, &want)
            .unwrap_err()
            .contains("relative L2"));
        let mut nan = want.clone();
        nan[3] = f32::NAN;
        assert!(compare(&nan, &want).unwrap_err().contains("logit 3"));
        assert!(compare(&want[1..], &want).is_err());
    }

    /// Every model step's failure, injected through the backend: `auto` serves the model on
    /// the CPU with one log line naming the step, `cuda` fails the start naming it; with no
    /// fault the model serves on the (emulated) GPU.
    #[test]
    fn a_failing_model_step_is_the_cpu_under_auto_and_an_error_under_cuda() {
        use kernels::gpu::inject::FaultyOpener;
        use kernels::gpu::{EmuOpener, Opener, Step};

        use crate::device::DeviceRequest;
        use crate::handle::{EngineConfig, EngineHandle, ModelSpec};

        let spec = ModelSpec {
            path: concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-llama").into(),
            served_name: "tiny".into(),
        };
        let config = |device| EngineConfig {
            device,
            kv_cache_tokens: Some(256),
            max_model_len: Some(256),
            max_num_batched_tokens: 64,
            max_num_seqs: 4,
            ..Default::default()
        };
        let start = |device, opener: &dyn Opener| {
            crate::test_log::capture(|| {
                EngineHandle::start_with(std::slice::from_ref(&spec), &config(device), opener)
            })
        };

        let (ok, _) = start(DeviceRequest::Auto, &EmuOpener);
        assert_eq!(ok.unwrap().models()[0].device, "emu:0");
        for step in [Step::Weights, Step::KvCache, Step::SelfTest] {
            let opener = FaultyOpener::new(EmuOpener, step);
            let (engine, logs) = start(DeviceRequest::Auto, &opener);
            let engine = engine.unwrap_or_else(|e| panic!("{step}: {e}"));
            assert_eq!(engine.models()[0].device, "cpu", "{step}");
            let lines: Vec<&str> = logs.lines().filter(|l| l.contains("on the CPU")).collect();
            assert_eq!(lines.len(), 1, "{step}: one line saying why: {logs}");
            assert!(
                lines[0].contains(&format!("serving tiny on the CPU: emu:0 {step} failed")),
                "{}",
                lines[0]
            );
            drop(engine);
            match start(DeviceRequest::Cuda(0), &opener).0 {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&format!("--device cuda:0: emu:0 {step} failed")),
                        "{msg}"
                    );
                    assert!(!msg.contains('\n'), "{msg}");
                }
                Ok(_) => panic!("{step}: --device cuda started"),
            }
        }
    }
}
