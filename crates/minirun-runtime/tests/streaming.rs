//! Streaming under a budget: a budget below the floor is refused before a payload byte is read,
//! naming every term; at the floor, at a middle budget and fully resident, on one thread and
//! on two, a run gives the same tokens and the same logit bits; the floor reads exactly the
//! bytes the plan predicts; expert memory stays within the cache and the slot pool.

mod common;

use common::{STREAMED_SHAPE, on_threads, packed, packed_synthetic};
use minirun_kernels::Activations;
use minirun_runtime::Decoder;
use minirun_runtime::argmax;
use minirun_runtime::models::deepseek_v3::DeepSeekV3;
use minirun_runtime::models::deepseek_v3::DeepSeekV3Config;
use minirun_stream::artifact::{Access, Artifact};
use minirun_stream::budget::Budget;
use minirun_stream::experts::ExpertCache;
use minirun_stream::model_weights::ModelWeights;
use minirun_stream::plan::{Layers, Mode, Plan, PlanError};
use minirun_stream::ranking::Holdable;
use minirun_stream::step::StepStats;

/// Stacked MLX containers, per-expert FP8 containers, per-expert bf16 blob members.
const FIXTURES: [&str; 3] = ["mlx-mxfp4", "hf-fp8-e8m0", "hf-bf16"];
const PROMPT: [u32; 4] = [0, 292, 354, 395];
const STEPS: usize = 12;

/// Greedy decoding: every step's logits as bits, the ids, and the storage figures summed over
/// the steps after the prompt.
fn run(model: &DeepSeekV3) -> (Vec<Vec<u32>>, Vec<u32>, StepStats) {
    let mut cache = model.new_cache();
    let mut bits = Vec::new();
    let mut ids = Vec::new();
    let mut decode = StepStats::default();
    let mut logits = Vec::new();
    for &t in &PROMPT {
        logits = model
            .step(t, &mut cache, &mut StepStats::default())
            .unwrap();
    }
    for _ in 0..STEPS {
        bits.push(logits.iter().map(|l| l.to_bits()).collect());
        let next = argmax(&logits);
        ids.push(next);
        let mut stats = StepStats::default();
        let wall = std::time::Instant::now();
        logits = model.step(next, &mut cache, &mut stats).unwrap();
        let wall = wall.elapsed();
        assert!(
            stats.read_busy <= wall,
            "storage busy {:?} longer than the step's {wall:?}",
            stats.read_busy
        );
        decode.read_busy += stats.read_busy;
        decode.expert_read_bytes += stats.expert_read_bytes;
        decode.expert_cache_misses += stats.expert_cache_misses;
        decode.expert_cache_hits += stats.expert_cache_hits;
        decode.layer_read_bytes += stats.layer_read_bytes;
    }
    (bits, ids, decode)
}

#[test]
fn a_budget_below_the_floor_is_refused_before_any_payload_is_read() {
    let dir = packed("mlx-mxfp4");
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let experts = DeepSeekV3::weights(&artifact, &config).unwrap();
    let floor = Plan::new(&artifact, &config, &experts, Budget::Floor, 64)
        .unwrap()
        .floor;
    let err = Plan::new(&artifact, &config, &experts, Budget::Bytes(floor - 1), 64).unwrap_err();
    let text = err.to_string();
    assert!(matches!(&err, PlanError::BelowFloor(b) if b.floor == floor));
    for term in [
        "resident weights",
        "layer buffers",
        "slot pool",
        "reserve",
        "KV cache for 64 tokens",
    ] {
        assert!(text.contains(term), "{term}: {text}");
    }
    assert_eq!(artifact.payload_bytes(), 0, "nothing was read to plan");
}

#[test]
fn streamed_runs_at_every_budget_and_thread_count_have_the_resident_bits() {
    for fixture in FIXTURES {
        let dir = packed(fixture);
        let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
        let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
        let resident = DeepSeekV3::load(&artifact, config.clone()).unwrap();
        let (reference, ids, resident_decode) = run(&resident);
        assert_eq!(resident_decode.read_busy, std::time::Duration::ZERO);

        let experts = DeepSeekV3::weights(&artifact, &config).unwrap();
        let floor = Plan::new(&artifact, &config, &experts, Budget::Floor, 64).unwrap();
        assert_eq!(floor.mode, Mode::Streamed, "{fixture}");
        // A middle budget: room for six experts in the cache. (These experts are tiny next to
        // their 16 KiB-aligned buffers, so any real budget with that room would hold the whole
        // model resident; the plan is the floor's with the cache widened.)
        let middle = Budget::Bytes(floor.floor + 6 * floor.expert_allocated_bytes);
        for budget in [Budget::Floor, middle, Budget::Generous] {
            let mut plan = Plan::new(&artifact, &config, &experts, budget, 64).unwrap();
            if budget == middle {
                // ... and one read in flight instead of one per chosen expert.
                plan = Plan {
                    cache_bytes: 6 * floor.expert_allocated_bytes,
                    reads_in_flight: 1,
                    ..floor.clone()
                };
            }
            for threads in [1, 2] {
                let model =
                    DeepSeekV3::load_planned(&artifact, config.clone(), &plan, &experts).unwrap();
                if budget == middle && threads == 1 {
                    // Opened afresh: the runs above left their own buffers in this one's pool.
                    let fresh = Artifact::open(dir.path(), Access::Unverified).unwrap();
                    let _model =
                        DeepSeekV3::load_planned(&fresh, config.clone(), &plan, &experts).unwrap();
                    assert_cache_made_at_load(&plan, &experts, fresh.kept_read_buffer_bytes());
                }
                let (bits, got, decode) = on_threads(threads, || run(&model));
                assert_eq!(got, ids, "{fixture} {budget} {threads} threads: tokens");
                assert!(
                    bits == reference,
                    "{fixture} {budget} {threads} threads: logit bits differ"
                );
                if budget == Budget::Floor {
                    assert_eq!(
                        decode.expert_cache_hits, 0,
                        "{fixture}: the floor caches nothing"
                    );
                    assert_eq!(
                        decode.expert_read_bytes,
                        plan.uncached_read_per_token * STEPS as u64,
                        "{fixture}: the floor reads what the plan predicts"
                    );
                    assert!(
                        decode.read_busy > std::time::Duration::ZERO,
                        "{fixture}: the floor's reads kept storage busy for no time"
                    );
                }
                if let Some((held, peak)) = model.expert_memory() {
                    assert!(
                        held <= plan.held_bytes + plan.cache_bytes,
                        "{fixture}: cache over its share"
                    );
                    assert!(
                        peak <= plan.held_bytes + plan.cache_bytes + plan.slot_pool_bytes,
                        "{fixture} {budget}: expert memory {peak} over cache + slot pool"
                    );
                }
                if budget == middle {
                    assert_eq!(plan.mode, Mode::Streamed, "{fixture}");
                    assert!(decode.expert_cache_hits > 0, "{fixture}: a cache that hits");
                    // What the cache keeps is decided in the router's order, so eight
                    // readers finishing in any order read what one reader reads.
                    let eight = Plan {
                        reads_in_flight: 8,
                        ..plan.clone()
                    };
                    let model =
                        DeepSeekV3::load_planned(&artifact, config.clone(), &eight, &experts)
                            .unwrap();
                    let (_, _, wide) = on_threads(threads, || run(&model));
                    assert_eq!(
                        (wide.expert_cache_hits, wide.expert_read_bytes),
                        (decode.expert_cache_hits, decode.expert_read_bytes),
                        "{fixture} {threads} threads: 8 readers hit and read what 1 does"
                    );
                }
            }
            if budget == Budget::Generous {
                assert_eq!(plan.mode, Mode::Resident, "{fixture}");
            }
        }
    }
}

/// What a streamed run under `plan` keeps ready at load (`made`) is its cache's buffers: whole
/// experts (all of one size in these fixtures), within the cache, and short of it by less than
/// one expert in each streamed layer's share.
fn assert_cache_made_at_load(plan: &Plan, weights: &ModelWeights, made: u64) {
    let streamed = (plan.moe_layers - plan.held_layers.len()) as u64;
    let expert = weights
        .expert_map()
        .iter()
        .flatten()
        .map(|experts| experts[0].held_bytes())
        .max()
        .unwrap();
    assert!(made > 0, "a cache with room makes buffers");
    assert_eq!(made % expert, 0, "whole experts: {made} of {expert}");
    assert!(
        made <= plan.cache_bytes,
        "{made} over the cache's {}",
        plan.cache_bytes
    );
    assert!(
        made + streamed * expert > plan.cache_bytes,
        "{made} leaves more than an expert a layer of {}",
        plan.cache_bytes
    );
}

/// A generated DeepSeek-V3-shaped artifact several times larger than its floor: streamed at
/// the floor (every layer's deterministic weights too, with read-ahead on and off, on 1 and 2
/// threads), with some layers' deterministic weights held, and with two whole MoE layers held,
/// it decodes the resident run's tokens with the same logit bits, reading exactly the plan's
/// bytes.
#[test]
fn an_artifact_several_times_its_budget_streams_with_the_resident_bits() {
    let dir = packed_synthetic(&STREAMED_SHAPE);
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let experts = DeepSeekV3::weights(&artifact, &config).unwrap();
    let plan = Plan::new(&artifact, &config, &experts, Budget::Floor, 64).unwrap();
    assert!(
        artifact.total_payload_bytes() > 3 * plan.floor,
        "{} bytes of weights, floor {}",
        artifact.total_payload_bytes(),
        plan.floor
    );
    // At the floor every layer's attention, router and shared expert streams too, the next
    // layer read while the current one computes; with read-ahead off, each when it is reached.
    assert_eq!(
        plan.streamed_layers,
        (0..config.num_hidden_layers).collect::<Vec<_>>()
    );
    assert!(plan.floor < plan.deterministic_floor);
    let mut streamed_runs = Vec::new();
    for (read_ahead, threads) in [(true, 1), (true, 2), (false, 2)] {
        let plan = Plan {
            read_ahead,
            ..plan.clone()
        };
        let streamed =
            DeepSeekV3::load_planned(&artifact, config.clone(), &plan, &experts).unwrap();
        let (bits, ids, decode) = on_threads(threads, || run(&streamed));
        assert!(artifact.payload_bytes() <= plan.resident_bytes);
        assert_eq!(
            decode.expert_read_bytes,
            plan.uncached_read_per_token * STEPS as u64
        );
        assert_eq!(
            decode.layer_read_bytes,
            plan.layer_read_per_token * STEPS as u64,
            "a step reads every streamed layer's deterministic weights once"
        );
        streamed_runs.push((bits, ids));
    }
    let (bits, ids) = streamed_runs.remove(0);
    for (other, _) in &streamed_runs {
        assert!(
            *other == bits,
            "1 and 2 threads, read-ahead on and off: the same bits"
        );
    }

    // Just short of every deterministic weight resident: the layers the rest pays for are held.
    let partial = Plan::new(
        &artifact,
        &config,
        &experts,
        Budget::Bytes(plan.deterministic_floor - 1),
        64,
    )
    .unwrap();
    assert!(
        !partial.streamed_layers.is_empty()
            && partial.streamed_layers.len() < config.num_hidden_layers,
        "{:?} {}",
        partial.streamed_layers,
        serde_json::to_string(&partial).unwrap()
    );
    let model = DeepSeekV3::load_planned(&artifact, config.clone(), &partial, &experts).unwrap();
    let (partial_bits, _, partial_decode) = run(&model);
    assert!(
        partial_bits == bits,
        "partly streamed layers give the same bits"
    );
    assert_eq!(
        partial_decode.layer_read_bytes,
        partial.layer_read_per_token * STEPS as u64
    );
    drop(model);

    // Room for exactly the first two MoE layers beyond the floor: those are held whole, read
    // once at load, and a token reads only the chosen experts of the others.
    let moe: Vec<usize> = (0..experts.layers.len())
        .filter(|&l| experts.layers[l].experts.is_some())
        .collect();
    let layer_bytes = |l: usize| -> u64 {
        let parts = experts.layers[l]
            .experts
            .iter()
            .flatten()
            .flat_map(|e| e.parts().into_iter().map(|p| &p.part));
        minirun_stream::layer_stream::resident_bytes(&artifact, parts)
    };
    let two_layers = layer_bytes(moe[0]) + layer_bytes(moe[1]);
    let budget = Budget::Bytes(plan.deterministic_floor + two_layers);
    let held = Plan::new(&artifact, &config, &experts, budget, 64).unwrap();
    assert_eq!(held.held_layers, moe[..2], "the first MoE layers are held");
    assert_eq!((held.held_bytes, held.cache_bytes), (two_layers, 0));
    assert!(held.streamed_layers.is_empty());
    let per_layer = plan.uncached_read_per_token / moe.len() as u64;
    assert_eq!(
        held.uncached_read_per_token,
        per_layer * (moe.len() - 2) as u64
    );
    // A fresh artifact, so that what it holds after loading is this model's alone.
    let fresh = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let model = DeepSeekV3::load_planned(&fresh, config.clone(), &held, &experts).unwrap();
    assert_eq!(
        fresh.payload_bytes(),
        held.resident_bytes + two_layers,
        "the resident weights and the held layers, read at load, as the plan counts them"
    );
    let (held_bits, held_ids, held_decode) = run(&model);
    assert_eq!(
        held_decode.expert_read_bytes,
        held.uncached_read_per_token * STEPS as u64,
        "a step reads exactly the chosen experts of the layers not held"
    );
    assert_eq!(model.expert_memory().unwrap().0, 0, "no cache left over");
    drop(model);

    let resident = DeepSeekV3::load(&artifact, config).unwrap();
    let (reference, reference_ids, _) = run(&resident);
    assert_eq!(ids, reference_ids);
    assert!(bits == reference, "logit bits differ");
    assert_eq!(held_ids, reference_ids);
    assert!(held_bits == reference, "logit bits differ with layers held");
    assert!(
        bits.iter()
            .flatten()
            .all(|&b| f32::from_bits(b).is_finite()),
        "the synthetic model's logits are finite"
    );
}

/// `Layers::StreamEvery`: every layer's deterministic weights stream even at a budget that holds
/// them all, the floor is the streaming one, what the budget has beyond it goes to what the
/// ranking holds and the expert cache, and a step reads each layer once, with the resident bits.
#[test]
fn every_layer_streams_when_asked_even_where_the_budget_holds_them() {
    let dir = packed_synthetic(&STREAMED_SHAPE);
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let experts = DeepSeekV3::weights(&artifact, &config).unwrap();
    let floor = Plan::new(&artifact, &config, &experts, Budget::Floor, 64).unwrap();
    let budget = Budget::Bytes(floor.deterministic_floor);
    let holding = Plan::new(&artifact, &config, &experts, budget, 64).unwrap();
    assert!(holding.streamed_layers.is_empty(), "the budget holds them");
    let plan_every = |budget| {
        let dial = (budget, Layers::StreamEvery);
        Plan::with_layers(&artifact, &config, &experts, dial, 64).unwrap()
    };
    let every = plan_every(budget);
    let all: Vec<usize> = (0..config.num_hidden_layers).collect();
    assert_eq!(every.streamed_layers, all);
    assert_eq!(every.layers, Layers::StreamEvery);
    assert_eq!(every.floor, floor.floor, "the streaming floor");
    assert_eq!(every.resident_bytes, floor.resident_bytes);
    assert_eq!(every.layer_read_per_token, floor.layer_read_per_token);
    let held: u64 = every
        .ranking
        .iter()
        .filter(|r| r.held)
        .map(|r| r.cost)
        .sum();
    assert!(
        every
            .ranking
            .iter()
            .all(|r| !matches!(r.what, Holdable::Layer { .. })),
        "no layer is offered to the budget"
    );
    let guesses = every.guessed_layers as u64 * every.slot_pool_bytes;
    assert_eq!(
        every.cache_bytes + guesses + held,
        floor.deterministic_floor - floor.floor,
        "the budget beyond the floor goes to what the ranking holds, the cache and its guesses"
    );
    assert_eq!(plan_every(Budget::Floor).budget, floor.floor);
    // Even where holding everything costs nothing more, nothing is held.
    let generous = plan_every(Budget::Generous);
    assert_eq!(
        (generous.mode, generous.streamed_layers),
        (Mode::Streamed, all)
    );

    let resident = DeepSeekV3::load(&artifact, config.clone()).unwrap();
    let (reference, _, _) = run(&resident);
    drop(resident);
    let streamed = DeepSeekV3::load_planned(&artifact, config, &every, &experts).unwrap();
    let (bits, _, decode) = run(&streamed);
    assert!(bits == reference, "every layer streamed: other logits");
    assert_eq!(
        decode.layer_read_bytes,
        every.layer_read_per_token * STEPS as u64,
        "a step reads every layer's deterministic weights once"
    );
}

/// With 8-bit activations (`--activations int8`) a streamed run still has the resident run's
/// bits, on one thread and on two; and those bits are not the f32 path's.
#[test]
fn eight_bit_activations_stream_with_their_resident_bits() {
    let dir = packed("mlx-affine4-g64");
    let exact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let mut artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    artifact.set_activations(Activations::Int8);
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let (reference, ids, _) = run(&DeepSeekV3::load(&artifact, config.clone()).unwrap());
    let (exact_bits, _, _) = run(&DeepSeekV3::load(&exact, config.clone()).unwrap());
    assert!(exact_bits != reference, "int8 gave the f32 path's bits");
    let experts = DeepSeekV3::weights(&artifact, &config).unwrap();
    let plan = Plan::new(&artifact, &config, &experts, Budget::Floor, 64).unwrap();
    assert_eq!(plan.mode, Mode::Streamed);
    for threads in [1, 2] {
        let model = DeepSeekV3::load_planned(&artifact, config.clone(), &plan, &experts).unwrap();
        let (bits, got, decode) = on_threads(threads, || run(&model));
        assert_eq!(got, ids, "{threads} threads: tokens");
        assert!(bits == reference, "{threads} threads: logit bits differ");
        assert!(decode.expert_read_bytes > 0, "the floor streamed nothing");
    }
}

/// A cache's buffers are made for its share of every streamed layer, and never past the limit
/// the memory available sets.
#[test]
fn a_cache_makes_its_buffers_within_its_limit() {
    let dir = packed(FIXTURES[0]);
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let map = DeepSeekV3::weights(&artifact, &config)
        .unwrap()
        .expert_map();
    let held: Vec<u64> = map
        .iter()
        .flatten()
        .map(|experts| experts[0].held_bytes())
        .collect();
    assert!(held.len() > 1, "a fixture with several MoE layers");
    assert!(held.windows(2).all(|w| w[0] == w[1]), "experts of one size");
    let (layers, expert) = (held.len() as u64, held[0]);
    let cache = ExpertCache::new(3 * expert * layers, layers as usize);

    let fresh = || {
        let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
        artifact.keep_read_buffers(4 * expert * layers);
        artifact
    };
    let whole = fresh();
    assert_eq!(cache.prepare(&whole, &map, u64::MAX), 3 * expert * layers);
    assert_eq!(whole.kept_read_buffer_bytes(), 3 * expert * layers);
    let limited = fresh();
    assert_eq!(
        cache.prepare(&limited, &map, 5 * expert + expert / 2),
        5 * expert,
        "three for the first layer, two for the next, none past the limit"
    );
    assert_eq!(limited.kept_read_buffer_bytes(), 5 * expert);
}
