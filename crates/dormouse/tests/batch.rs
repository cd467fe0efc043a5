//! Batched decoding gives each sequence the bits it gets alone: `Dormouse::step` rows against
//! lone steps, and `Batch` against `generate`, byte for byte, through cache rebuilds.

use std::ops::ControlFlow;

use candle_core::Device;
use dormouse::batch::{Batch, Event, Request};
use dormouse::init::seeded_model;
use dormouse::sample::{Sampler, SamplingParams, generate};
use dormouse::{Dormouse, DormouseConfig, KvCache};

fn model(cfg: &DormouseConfig, seed: u64) -> Dormouse {
    seeded_model(cfg, seed, &Device::Cpu).unwrap().1
}

/// `small`'s compute shapes (d_model 384, MLP 1216) with a small memory, so the products are
/// the sizes served models run.
fn small_shapes() -> DormouseConfig {
    DormouseConfig {
        engram_rows: 512,
        ..DormouseConfig::preset("small").unwrap()
    }
}

fn prompts(count: usize) -> Vec<Vec<u8>> {
    let text = b"Alice was beginning to get very tired of sitting by her sister on the bank, and of having \
        nothing to do: once or twice she had peeped into the book her sister was reading";
    (0..count)
        .map(|i| text[i % 7..(i % 7) + 1 + (i * 13) % 60].to_vec())
        .collect()
}

fn prefilled(model: &Dormouse, prompts: &[Vec<u8>]) -> Vec<KvCache> {
    prompts
        .iter()
        .map(|p| {
            let mut cache = KvCache::new(model.config());
            model.forward(&[p], Some(&mut cache)).unwrap();
            cache
        })
        .collect()
}

fn bits(rows: &candle_core::Tensor) -> Vec<Vec<u32>> {
    rows.to_vec2::<f32>()
        .unwrap()
        .into_iter()
        .map(|row| row.into_iter().map(f32::to_bits).collect())
        .collect()
}

/// Rows of one step over B sequences are the bits of each sequence stepped alone, over several
/// steps at different positions: B = 2, 3, 7, 16, 64 for nano's shapes, 3 and 16 for small's.
#[test]
fn a_batched_step_gives_every_row_the_bits_of_its_lone_step() {
    let cases = [
        (
            DormouseConfig::preset("nano").unwrap(),
            &[2, 3, 7, 16, 64][..],
        ),
        (small_shapes(), &[3, 16][..]),
    ];
    for (cfg, batches) in cases {
        let model = model(&cfg, 11);
        for &batch in batches {
            let prompts = prompts(batch);
            let mut alone = prefilled(&model, &prompts);
            let mut together = prefilled(&model, &prompts);
            for step in 0..4 {
                let bytes: Vec<u8> = (0..batch).map(|i| b'a' + ((i + step) % 26) as u8).collect();
                let lone: Vec<Vec<u32>> = bytes
                    .iter()
                    .zip(&mut alone)
                    .map(|(&b, cache)| bits(&model.step(&[b], &mut [cache]).unwrap()).remove(0))
                    .collect();
                let mut refs: Vec<&mut KvCache> = together.iter_mut().collect();
                let rows = bits(&model.step(&bytes, &mut refs).unwrap());
                for (i, (row, lone)) in rows.iter().zip(&lone).enumerate() {
                    assert!(
                        row == lone,
                        "d_model {}, batch {batch}, step {step}, row {i}: logit bits differ",
                        cfg.d_model
                    );
                }
            }
            assert!(
                alone
                    .iter()
                    .zip(&together)
                    .all(|(a, t)| a.position() == t.position())
            );
        }
    }
}

/// The step is the function the full forward pass computes: a prompt stepped byte by byte
/// gives the forward pass's argmax at every position.
#[test]
fn stepping_byte_by_byte_follows_the_forward_pass() {
    let cfg = DormouseConfig::preset("nano").unwrap();
    let model = model(&cfg, 3);
    let text = &prompts(9)[8];
    let full = model.forward(&[text], None).unwrap().squeeze(0).unwrap();
    let mut cache = KvCache::new(&cfg);
    let mut argmax = vec![model.forward(&[&text[..1]], Some(&mut cache)).unwrap()];
    for &byte in &text[1..] {
        argmax.push(
            model
                .step(&[byte], &mut [&mut cache])
                .unwrap()
                .unsqueeze(0)
                .unwrap(),
        );
    }
    let stepped = candle_core::Tensor::cat(&argmax, 1)
        .unwrap()
        .squeeze(0)
        .unwrap();
    let top = |t: &candle_core::Tensor| t.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    assert_eq!(top(&full), top(&stepped));
}

#[test]
fn a_step_refuses_caches_it_cannot_continue() {
    let cfg = DormouseConfig {
        max_seq_len: 8,
        ..DormouseConfig::preset("nano").unwrap()
    };
    let model = model(&cfg, 1);
    let mut two = KvCache::new(&cfg);
    model.forward(&[b"ab", b"cd"], Some(&mut two)).unwrap();
    let error = model.step(b"x", &mut [&mut two]).unwrap_err().to_string();
    assert!(error.contains("one sequence each"), "{error}");
    let mut full = KvCache::new(&cfg);
    model.forward(&[b"abcdefgh"], Some(&mut full)).unwrap();
    let error = model.step(b"x", &mut [&mut full]).unwrap_err().to_string();
    assert!(error.contains("past max_seq_len 8"), "{error}");
    let error = model.step(b"xy", &mut [&mut full]).unwrap_err().to_string();
    assert!(error.contains("one byte per cache"), "{error}");
}

fn alone(model: &Dormouse, request: &Request) -> Vec<u8> {
    let mut bytes = Vec::new();
    generate(
        model,
        &request.prompt,
        request.max_new,
        &mut Sampler::new(request.sampling),
        |b| {
            bytes.push(b);
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    bytes
}

/// Staggered admissions, greedy and sampled, past `max_seq_len` (so caches are rebuilt while
/// others step), a zero-byte request: every sequence gets `generate`'s bytes.
#[test]
fn a_batch_gives_every_request_the_bytes_generate_gives_it() {
    let cfg = DormouseConfig {
        max_seq_len: 24,
        ..DormouseConfig::preset("nano").unwrap()
    };
    let model = model(&cfg, 5);
    let sampled = |seed| SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        seed,
    };
    let requests: Vec<Request> = prompts(6)
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| Request {
            prompt,
            max_new: [40, 7, 0, 31, 60, 1][i],
            sampling: if i % 2 == 0 {
                SamplingParams::default()
            } else {
                sampled(i as u64)
            },
        })
        .collect();
    let mut heard: Vec<Vec<u8>> = vec![Vec::new(); requests.len()];
    let mut finished = vec![false; requests.len()];
    let mut listen = |id: u64, event| {
        match event {
            Event::Byte(b) => heard[id as usize].push(b),
            Event::Finished => finished[id as usize] = true,
        }
        true
    };
    let mut batch = Batch::new(&model);
    let mut steps = 0;
    for (id, request) in requests.iter().enumerate() {
        batch
            .admit(id as u64, request.clone(), &mut listen)
            .unwrap();
        batch.step(&mut listen).unwrap();
        steps += 1;
    }
    while !batch.is_empty() {
        batch.step(&mut listen).unwrap();
        steps += 1;
    }
    assert!(steps >= 60, "the longest request decoded in the batch");
    for (id, request) in requests.iter().enumerate() {
        assert_eq!(heard[id], alone(&model, request), "request {id}");
        assert!(finished[id], "request {id} heard its end");
    }
}

/// A listener that stops hearing ends its sequence there; the others go on, and an empty
/// prompt is refused without touching the batch.
#[test]
fn a_sequence_ends_when_its_listener_does_and_bad_prompts_are_refused() {
    let cfg = DormouseConfig::preset("nano").unwrap();
    let model = model(&cfg, 2);
    let mut batch = Batch::new(&model);
    let request = |prompt: &[u8]| Request {
        prompt: prompt.to_vec(),
        max_new: 20,
        sampling: SamplingParams::default(),
    };
    let mut heard = [0usize; 2];
    let mut listen = |id: u64, event| {
        if let Event::Byte(_) = event {
            heard[id as usize] += 1;
        }
        id != 0 || heard[0] < 3
    };
    batch.admit(0, request(b"one"), &mut listen).unwrap();
    batch.admit(1, request(b"two"), &mut listen).unwrap();
    assert!(batch.admit(2, request(b""), &mut listen).is_err());
    assert_eq!(batch.len(), 2);
    while !batch.is_empty() {
        batch.step(&mut listen).unwrap();
    }
    assert_eq!(heard, [3, 20]);
    assert!(!batch.cancel(1));
}

/// Seventy sequences in one step get the bytes each gets alone.
#[test]
fn seventy_sequences_at_once_get_the_bytes_each_gets_alone() {
    let cfg = DormouseConfig::preset("nano").unwrap();
    let model = model(&cfg, 8);
    let requests: Vec<Request> = prompts(70)
        .into_iter()
        .map(|prompt| Request {
            prompt,
            max_new: 4,
            sampling: SamplingParams::default(),
        })
        .collect();
    let mut heard: Vec<Vec<u8>> = vec![Vec::new(); requests.len()];
    let mut listen = |id: u64, event| {
        if let Event::Byte(b) = event {
            heard[id as usize].push(b);
        }
        true
    };
    let mut batch = Batch::new(&model);
    for (id, request) in requests.iter().enumerate() {
        batch
            .admit(id as u64, request.clone(), &mut listen)
            .unwrap();
    }
    assert_eq!(batch.len(), 70);
    while !batch.is_empty() {
        batch.step(&mut listen).unwrap();
    }
    for (id, request) in requests.iter().enumerate() {
        assert_eq!(heard[id], alone(&model, request), "request {id}");
    }
}
