//! Batched decoding: one step for several sequences gives each the logit bits of stepping it
//! alone, for every architecture, resident and with its experts streamed at the floor (and, for
//! an artifact whose layers stream too, where a 3-sequence step reads each streamed layer once,
//! not three times), on one thread and on two; a batch step with a bad token moves no cache;
//! prompts prefilled together (the rows of shared passes, across a chunk boundary) have the bits
//! each has alone; and a batch whose sequences arrive, sample and end at different steps gives
//! each exactly the tokens `generate` gives it alone.

mod common;

use std::path::Path;

use common::{STREAMED_SHAPE, greedy_bits, on_threads, packed, packed_synthetic};
use minirun_pack::{PackOptions, pack};
use minirun_runtime::Decoder;
use minirun_runtime::Model;
use minirun_runtime::{Batch, Event, Request};
use minirun_runtime::{Sampling, StopReason, argmax, generate};
use minirun_runtime::{Session, Trust};
use minirun_stream::budget::Budget;
use minirun_stream::step::{ModelError, StepStats};

const STEPS: usize = 6;

fn packed_from(relative: &str) -> tempfile::TempDir {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let out = tempfile::tempdir().unwrap();
    pack(&source, out.path(), &PackOptions::default(), &|_| {}).unwrap();
    out
}

/// Prompts of different lengths, so the sequences sit at different positions.
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    [3usize, 7, 1]
        .iter()
        .enumerate()
        .map(|(s, &len)| {
            (0..len)
                .map(|i| ((i * 31 + s * 97 + 5) % vocab) as u32)
                .collect()
        })
        .collect()
}

/// Each prompt's logits after prefill and after each of `STEPS` greedy steps taken as one
/// batch, as bits; and the storage figures of the batch steps.
fn batched_bits(model: &Model, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, Vec<StepStats>) {
    let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut logits: Vec<Vec<f32>> = prompts
        .iter()
        .zip(&mut caches)
        .map(|(p, c)| model.prefill(p, c, &mut StepStats::default()).unwrap())
        .collect();
    let mut bits: Vec<Vec<u32>> = logits.iter().map(|l| common::bits(l)).collect();
    let mut steps = Vec::new();
    for _ in 0..STEPS {
        let tokens: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
        let mut stats = StepStats::default();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        logits = model.step_batch(&tokens, &mut refs, &mut stats).unwrap();
        for (b, l) in bits.iter_mut().zip(&logits) {
            b.extend(common::bits(l));
        }
        steps.push(stats);
    }
    (bits, steps)
}

fn alone_bits(model: &Model, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| greedy_bits(model, p, STEPS).0)
        .collect()
}

fn assert_batch_is(
    model: &Model,
    prompts: &[Vec<u32>],
    alone: &[Vec<u32>],
    label: &str,
) -> Vec<StepStats> {
    let (batched, steps) = batched_bits(model, prompts);
    for (s, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert!(a == b, "{label}: sequence {s} has other bits in the batch");
    }
    steps
}

#[test]
fn a_batch_step_gives_every_sequence_the_bits_of_stepping_it_alone() {
    let artifacts = [
        ("deepseek_v3 affine4", packed("mlx-affine4-g64")),
        ("deepseek_v3 mxfp4", packed("mlx-mxfp4")),
        ("deepseek_v3 fp8", packed("hf-fp8-e8m0")),
        (
            "deepseek_v4",
            packed_from("tests/data/deepseek-v4/tiny-fp8-fp4"),
        ),
        ("kimi_k3", packed_from("tests/data/kimi-k3/mlx-k3mix")),
        (
            "qwen3_moe",
            packed_from("tests/data/qwen3-moe/mlx-affine4-g64"),
        ),
        ("gpt_oss", packed_from("tests/data/gpt-oss/openai-mxfp4")),
    ];
    for (label, dir) in &artifacts {
        let session = Session::open(dir.path(), Trust::Unverified).unwrap();
        let prompts = prompts(session.architecture.vocab_size());
        let model = session.model().unwrap();
        let alone = alone_bits(&model, &prompts);
        assert_batch_is(&model, &prompts, &alone, label);
        // At the floor the routed experts stream: the same bits again.
        let (plan, experts) = session.plan(Budget::Floor, 64).unwrap();
        let streamed = session.planned_model(&plan, &experts).unwrap();
        assert_batch_is(
            &streamed,
            &prompts,
            &alone,
            &format!("{label} at the floor"),
        );
    }
}

/// Prompts across a chunk boundary and of one token, so that a pass holds rows of several.
fn long_prompts(vocab: usize) -> Vec<Vec<u32>> {
    [70usize, 3, 1, 64]
        .iter()
        .enumerate()
        .map(|(s, &len)| {
            (0..len)
                .map(|i| ((i * 17 + s * 131 + 3) % vocab) as u32)
                .collect()
        })
        .collect()
}

/// Each prompt's logits after prefill and after one greedy step, as bits: alone, or with the
/// prompts as the rows of shared passes and the step as one batch.
fn prefilled_bits(model: &Model, prompts: &[Vec<u32>], together: bool) -> Vec<Vec<u32>> {
    let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut stats = StepStats::default();
    let logits: Vec<Vec<f32>> = match together {
        true => {
            let slices: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            let mut refs: Vec<_> = caches.iter_mut().collect();
            model.prefill_batch(&slices, &mut refs, &mut stats).unwrap()
        }
        false => prompts
            .iter()
            .zip(&mut caches)
            .map(|(p, c)| model.prefill(p, c, &mut stats).unwrap())
            .collect(),
    };
    let tokens: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
    let mut refs: Vec<_> = caches.iter_mut().collect();
    let next = model.step_batch(&tokens, &mut refs, &mut stats).unwrap();
    logits
        .iter()
        .zip(&next)
        .map(|(a, b)| [common::bits(a), common::bits(b)].concat())
        .collect()
}

#[test]
fn prompts_prefilled_together_have_the_bits_each_has_alone() {
    let artifacts = [
        ("deepseek_v3", packed("mlx-mxfp4")),
        (
            "deepseek_v4",
            packed_from("tests/data/deepseek-v4/tiny-fp8-fp4"),
        ),
        ("kimi_k3", packed_from("tests/data/kimi-k3/mlx-k3mix")),
        (
            "qwen3_moe",
            packed_from("tests/data/qwen3-moe/mlx-affine4-g64"),
        ),
        ("gpt_oss", packed_from("tests/data/gpt-oss/openai-mxfp4")),
    ];
    for (label, dir) in &artifacts {
        let session = Session::open(dir.path(), Trust::Unverified).unwrap();
        let prompts = long_prompts(session.architecture.vocab_size());
        let (plan, experts) = session.plan(Budget::Floor, 160).unwrap();
        for (how, model) in [
            ("resident", session.model().unwrap()),
            (
                "at the floor",
                session.planned_model(&plan, &experts).unwrap(),
            ),
        ] {
            let alone = prefilled_bits(&model, &prompts, false);
            let together = prefilled_bits(&model, &prompts, true);
            for (s, (a, t)) in alone.iter().zip(&together).enumerate() {
                assert!(
                    a == t,
                    "{label} {how}: prompt {s} has other bits prefilled together"
                );
            }
            let mut caches = [model.new_cache(), model.new_cache()];
            let mut refs: Vec<_> = caches.iter_mut().collect();
            let bad = [1, session.architecture.vocab_size() as u32];
            let err = model
                .prefill_batch(&[&[1, 2], &bad], &mut refs, &mut StepStats::default())
                .unwrap_err();
            assert!(matches!(err, ModelError::Token(..)), "{label}: {err}");
        }
    }
}

#[test]
fn a_streamed_batch_step_reads_each_streamed_layer_once_for_all_its_sequences() {
    let dir = packed_synthetic(&STREAMED_SHAPE);
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let (plan, experts) = session.plan(Budget::Floor, 64).unwrap();
    assert!(!plan.streamed_layers.is_empty());
    let prompts = prompts(session.architecture.vocab_size());
    let model = session.planned_model(&plan, &experts).unwrap();
    let alone = alone_bits(&model, &prompts);
    for threads in [1, 2] {
        let label = format!("floor, {threads} threads");
        let steps = on_threads(threads, || {
            assert_batch_is(&model, &prompts, &alone, &label)
        });
        for stats in steps {
            assert_eq!(
                stats.layer_read_bytes, plan.layer_read_per_token,
                "three sequences, one read of every streamed layer"
            );
        }
    }
}

#[test]
fn a_batch_step_is_refused_without_one_token_per_cache() {
    let dir = packed("mlx-affine4-g64");
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let model = session.model().unwrap();
    let mut caches = [model.new_cache(), model.new_cache()];
    let mut refs: Vec<_> = caches.iter_mut().collect();
    let err = model
        .step_batch(&[1], &mut refs, &mut StepStats::default())
        .unwrap_err();
    assert!(matches!(
        err,
        ModelError::BatchShape {
            tokens: 1,
            caches: 2
        }
    ));
    let vocab = session.architecture.vocab_size() as u32;
    let err = model
        .step_batch(&[1, vocab], &mut refs, &mut StepStats::default())
        .unwrap_err();
    assert!(matches!(err, ModelError::Token(t, _) if t == vocab));
    assert!(
        caches.iter().all(|c| model.cached(c) == 0),
        "no cache moved"
    );
}

fn requests(vocab: usize, stop: u32) -> Vec<Request> {
    let sampled = |seed| Sampling {
        temperature: 0.9,
        top_p: 0.95,
        seed,
    };
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
    let prompts = prompts(vocab);
    vec![
        Request {
            prompt: prompts[0].clone(),
            max_tokens: 9,
            sampling: greedy,
            stop: Vec::new(),
        },
        Request {
            prompt: prompts[1].clone(),
            max_tokens: 12,
            sampling: sampled(7),
            stop: vec![stop],
        },
        Request {
            prompt: prompts[2].clone(),
            max_tokens: 4,
            sampling: sampled(8),
            stop: Vec::new(),
        },
        Request {
            prompt: prompts[0].clone(),
            max_tokens: 0,
            sampling: greedy,
            stop: Vec::new(),
        },
    ]
}

#[test]
fn sequences_arriving_and_ending_at_different_steps_get_the_tokens_they_get_alone() {
    let dir = packed("mlx-mxfp4");
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let vocab = session.architecture.vocab_size();
    let model = session.model().unwrap();
    // A stop id the sampled sequence actually draws, so that one ends by its stop token.
    let probe = requests(vocab, u32::MAX);
    let (drawn, _) = generate(
        &model,
        &probe[1].prompt,
        12,
        probe[1].sampling,
        &[],
        |_, _| {},
    )
    .unwrap();
    let requests = requests(vocab, drawn[5]);
    let alone: Vec<(Vec<u32>, StopReason)> = requests
        .iter()
        .map(|r| {
            let (ids, figures) = generate(
                &model,
                &r.prompt,
                r.max_tokens,
                r.sampling,
                &r.stop,
                |_, _| {},
            )
            .unwrap();
            (ids, figures.stop_reason)
        })
        .collect();
    assert_eq!(alone[1].1, StopReason::EndOfSequence);

    let mut heard: Vec<(Vec<u32>, Option<StopReason>)> =
        vec![(Vec::new(), None); requests.len() + 2];
    let mut on_event = |id: u64, event: Event| {
        let seq = &mut heard[id as usize];
        assert!(seq.1.is_none(), "sequence {id} heard after it ended");
        match event {
            Event::Token(t) => seq.0.push(t),
            Event::Finished(reason) => seq.1 = Some(reason),
        }
        true
    };
    let mut batch = Batch::new(&model);
    let mut stats = StepStats::default();
    batch
        .admit(0, requests[0].clone(), &mut stats, &mut on_event)
        .unwrap();
    batch.step(&mut stats, &mut on_event).unwrap();
    batch.step(&mut stats, &mut on_event).unwrap();
    batch
        .admit(1, requests[1].clone(), &mut stats, &mut on_event)
        .unwrap();
    batch.step(&mut stats, &mut on_event).unwrap();
    // Two arrive together: their prompts share passes.
    let refused = batch.admit_all(
        vec![(2, requests[2].clone()), (3, requests[3].clone())],
        &mut stats,
        &mut on_event,
    );
    assert!(refused.is_empty());
    assert_eq!(batch.len(), 3, "the max_tokens 0 request ended at once");
    // A prompt the model refuses is refused alone; the one beside it still runs.
    let bad = Request {
        prompt: vec![vocab as u32],
        ..requests[2].clone()
    };
    let zero = Request {
        max_tokens: 0,
        ..requests[2].clone()
    };
    let refused = batch.admit_all(vec![(4, bad), (5, zero)], &mut stats, &mut on_event);
    assert_eq!(refused.len(), 1, "only the bad prompt is refused");
    assert!(matches!(refused[0], (4, ModelError::Token(..))));
    while !batch.is_empty() {
        batch.step(&mut stats, &mut on_event).unwrap();
    }
    for (id, ((ids, reason), (alone_ids, alone_reason))) in
        heard.iter().zip(&alone).enumerate().take(requests.len())
    {
        assert_eq!(ids, alone_ids, "sequence {id}");
        assert_eq!(*reason, Some(*alone_reason), "sequence {id}");
    }
    assert_eq!(heard[5].1, Some(StopReason::MaxTokens), "the good one ran");
    let err = batch
        .admit(
            9,
            Request {
                prompt: vec![vocab as u32],
                ..requests[0].clone()
            },
            &mut stats,
            |_, _| true,
        )
        .unwrap_err();
    assert!(matches!(err, ModelError::Token(..)));
    assert!(batch.is_empty());
}

#[test]
fn a_sequence_nobody_listens_to_leaves_the_batch_and_the_others_go_on() {
    let dir = packed("mlx-affine4-g64");
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let vocab = session.architecture.vocab_size();
    let model = session.model().unwrap();
    let requests = requests(vocab, u32::MAX);
    let alone = generate(
        &model,
        &requests[0].prompt,
        9,
        requests[0].sampling,
        &[],
        |_, _| {},
    )
    .unwrap()
    .0;
    let mut batch = Batch::new(&model);
    let mut stats = StepStats::default();
    let mut kept = Vec::new();
    let mut heard_from_gone = 0;
    let mut on_event = |id: u64, event: Event| match (id, event) {
        (0, Event::Token(t)) => {
            kept.push(t);
            true
        }
        (1, Event::Token(_)) => {
            heard_from_gone += 1;
            heard_from_gone < 3
        }
        _ => true,
    };
    batch
        .admit(0, requests[0].clone(), &mut stats, &mut on_event)
        .unwrap();
    batch
        .admit(1, requests[1].clone(), &mut stats, &mut on_event)
        .unwrap();
    while !batch.is_empty() {
        batch.step(&mut stats, &mut on_event).unwrap();
    }
    assert_eq!(heard_from_gone, 3, "dropped at the token nobody took");
    assert_eq!(kept, alone);
    assert!(!batch.cancel(0), "it ended");
}
