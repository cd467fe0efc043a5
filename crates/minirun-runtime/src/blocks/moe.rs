//! Routed mixture of experts: routing, and dispatch to held or streamed experts. Each function
//! fixes its operations and their order, so a layer gives the same bits at any batch size and
//! whether its experts were held or read just now.

use std::sync::Arc;
use std::time::Duration;

use crate::blocks::mlp::{Activation, Mlp, MlpBiases};
use crate::blocks::norm::sigmoid;
use crate::blocks::products::top_k;
use crate::blocks::shared_rows::SharedRows;
use minirun_kernels::{KernelError, QMatrix};
use minirun_stream::artifact::ArtifactError;
use minirun_stream::expert_stream::ExpertStream;
use minirun_stream::experts::ExpertNames;
use minirun_stream::fetched_experts::with_fetched;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::{ExpertsFrom, Weights};

/// How a router turns its logits into routes.
pub(crate) struct Routing<'b> {
    pub correction_bias: &'b [f32],
    pub experts_per_token: usize,
    /// Expert groups, and how many of them a token may choose from.
    pub groups: usize,
    pub groups_chosen: usize,
    pub renormalize: bool,
    /// Added to the chosen weights' sum before dividing (mlx-lm's K3 adds 1e-20; DeepSeek none).
    pub renormalize_eps: f32,
    pub scaling: f32,
}

impl Routing<'_> {
    /// Sigmoid scores; the bias-corrected ones choose the groups (by the sum of each group's
    /// top two) and then the experts; the uncorrected scores of the chosen ones, renormalised
    /// and scaled, weight their outputs. Ties go to the lower index.
    pub fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
        let mut choice: Vec<f32> = scores
            .iter()
            .zip(self.correction_bias)
            .map(|(s, b)| s + b)
            .collect();
        if self.groups > 1 {
            let size = choice.len() / self.groups;
            let mut groups: Vec<(f32, usize)> = choice
                .chunks(size)
                .map(|g| {
                    let mut sorted = g.to_vec();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    match sorted[..] {
                        [a, b, ..] => a + b,
                        [a] => a,
                        [] => 0.0,
                    }
                })
                .zip(0..)
                .collect();
            groups.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, g) in groups.iter().skip(self.groups_chosen) {
                choice[g * size..(g + 1) * size].fill(0.0);
            }
        }
        let chosen = top_k(&choice, self.experts_per_token);
        let mut weights: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
        if chosen.len() > 1 && self.renormalize {
            let sum: f32 = weights.iter().sum::<f32>() + self.renormalize_eps;
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        chosen
            .iter()
            .zip(weights)
            .map(|(&e, w)| (e, w * self.scaling))
            .collect()
    }
}

/// Qwen3-MoE's routing: the softmax over every expert's logit, the `k` most probable (ties to
/// the lower index), their probabilities renormalised to sum to 1 when `renormalize`.
pub(crate) fn softmax_top_k(logits: &[f32], k: usize, renormalize: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f32 = exps.iter().sum();
    let probs: Vec<f32> = exps.iter().map(|e| e / total).collect();
    let chosen = top_k(&probs, k);
    let sum: f32 = chosen.iter().map(|&e| probs[e]).sum();
    chosen
        .into_iter()
        .map(|e| match renormalize {
            true => (e, probs[e] / sum),
            false => (e, probs[e]),
        })
        .collect()
}

/// gpt-oss's routing: the `k` largest logits (ties to the lower index), weighted by the
/// softmax over those `k` alone.
pub(crate) fn top_k_softmax(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let chosen = top_k(logits, k);
    let max = chosen
        .iter()
        .map(|&e| logits[e])
        .fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = chosen.iter().map(|&e| (logits[e] - max).exp()).collect();
    let total: f32 = exps.iter().sum();
    chosen
        .into_iter()
        .zip(exps)
        .map(|(e, x)| (e, x / total))
        .collect()
}

/// The experts of the first row's routes, in their order: what a guess reads ahead (see
/// [`minirun_stream::guessed_experts`]); `None` when routing failed or there is no row.
pub(crate) fn first_row_experts<E>(
    routes: Result<Vec<Vec<(usize, f32)>>, E>,
) -> Option<Vec<usize>> {
    let first = routes.ok()?.into_iter().next()?;
    Some(first.into_iter().map(|(e, _)| e).collect())
}

/// An expert's output for the `k`-th route of `row`: `((row, k), output)`.
type SlotOutput = ((usize, usize), Vec<f32>);

/// Which rows of a batch each chosen expert serves: `(row, k)` for the row's `k`-th route.
pub(crate) struct ExpertUsers {
    /// The chosen experts in order of first choice (row by row, each row in its router order).
    pub order: Vec<usize>,
    users: std::collections::HashMap<usize, Vec<(usize, usize)>>,
}

impl ExpertUsers {
    pub fn of(routes: &[Vec<(usize, f32)>]) -> ExpertUsers {
        let mut order = Vec::new();
        let mut users: std::collections::HashMap<usize, Vec<(usize, usize)>> =
            std::collections::HashMap::new();
        for (row, chosen) in routes.iter().enumerate() {
            for (k, &(e, _)) in chosen.iter().enumerate() {
                let served = users.entry(e).or_default();
                if served.is_empty() {
                    order.push(e);
                }
                served.push((row, k));
            }
        }
        ExpertUsers { order, users }
    }

    /// `expert` on the rows it serves: each output with its `(row, k)` slot.
    fn outputs(
        &self,
        e: usize,
        expert: &Mlp<QMatrix<'_>>,
        input: &SharedRows,
        stats: &mut StepStats,
    ) -> Result<Vec<SlotOutput>, ModelError> {
        let served = self.users.get(&e).map_or(&[][..], Vec::as_slice);
        let rows: Vec<usize> = served.iter().map(|&(row, _)| row).collect();
        Ok(served
            .iter()
            .copied()
            .zip(expert.forward_on(input, &rows, stats)?)
            .collect())
    }

    /// Runs `expert` on the rows it serves, filling their slots of `outputs`.
    fn run(
        &self,
        e: usize,
        expert: &Mlp<QMatrix<'_>>,
        input: &SharedRows,
        outputs: &mut [Vec<Vec<f32>>],
        stats: &mut StepStats,
    ) -> Result<(), ModelError> {
        for ((row, k), out) in self.outputs(e, expert, input, stats)? {
            outputs[row][k] = out;
        }
        Ok(())
    }
}

/// Per row of a batch, one expert output per route, in the route's order.
pub type RoutedOutputs = Vec<Vec<Vec<f32>>>;

/// Per row of a batch, `Σ weight · output` over its routes, in the route's order (`width` wide).
pub(crate) fn weighted_sum(
    routes: &[Vec<(usize, f32)>],
    outputs: &RoutedOutputs,
    width: usize,
) -> Vec<Vec<f32>> {
    let mut sums = vec![vec![0f32; width]; routes.len()];
    for ((sum, chosen), outs) in sums.iter_mut().zip(routes).zip(outputs) {
        for (&(_, weight), out) in chosen.iter().zip(outs) {
            sum.iter_mut().zip(out).for_each(|(s, o)| *s += o * weight);
        }
    }
    sums
}

/// Every row of `xs` through the experts its route chose, their outputs weighted and summed
/// in the route's order (`width` wide): a routed block with nothing beside its experts.
pub(crate) fn routed_sum(
    experts: &RoutedExperts,
    routes: &[Vec<(usize, f32)>],
    xs: &[Vec<f32>],
    width: usize,
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let (outputs, ()) = run_routed(experts, routes, xs, |_| Ok(()), stats)?;
    Ok(weighted_sum(routes, &outputs, width))
}

/// A layer's routed experts: held, or read when the router picks them.
pub enum RoutedExperts<'a> {
    Resident(Vec<Mlp<QMatrix<'a>>>),
    Streamed {
        layer: usize,
        stream: Arc<ExpertStream<'a>>,
        activation: Activation,
        /// Per expert, where the architecture's experts have biases (held: they are vectors).
        biases: Vec<Arc<MlpBiases>>,
    },
    /// A dry build's (see [`minirun_stream::weights`]): never run.
    Unread,
}

impl<'w> RoutedExperts<'w> {
    /// The routed experts of `w`'s layer under `module`, each a gated MLP with `activation`
    /// (`names` and `sizes` as [`Weights::routed_experts`] takes them).
    pub fn new(
        w: &Weights<'w>,
        module: &str,
        names: ExpertNames,
        sizes: (usize, usize, usize),
        activation: Activation,
    ) -> Result<RoutedExperts<'w>, ArtifactError> {
        Ok(match w.routed_experts(module, names, sizes)? {
            ExpertsFrom::Recorded => RoutedExperts::Unread,
            ExpertsFrom::Storage { layer, stream } => RoutedExperts::Streamed {
                layer,
                stream,
                activation,
                biases: Vec::new(),
            },
            ExpertsFrom::Held(held) => RoutedExperts::Resident(
                held.into_iter()
                    .map(|projections| Mlp {
                        projections,
                        activation,
                        biases: None,
                    })
                    .collect(),
            ),
        })
    }

    /// The same experts, expert `e` adding `biases[e]`; refused unless there is one per expert.
    pub fn with_biases(
        self,
        biases: Vec<Arc<MlpBiases>>,
    ) -> Result<RoutedExperts<'w>, ArtifactError> {
        let experts = match &self {
            RoutedExperts::Resident(held) => Some(held.len()),
            RoutedExperts::Streamed { layer, stream, .. } => stream
                .map
                .get(*layer)
                .and_then(Option::as_ref)
                .map(Vec::len),
            RoutedExperts::Unread => None,
        };
        if let Some(experts) = experts
            && experts != biases.len()
        {
            return Err(ArtifactError::Tensor {
                name: "routed experts' biases".into(),
                reason: format!("{} for {experts} experts", biases.len()),
            });
        }
        Ok(match self {
            RoutedExperts::Resident(held) => RoutedExperts::Resident(
                held.into_iter()
                    .zip(biases)
                    .map(|(mlp, b)| Mlp {
                        biases: Some(b),
                        ..mlp
                    })
                    .collect(),
            ),
            RoutedExperts::Streamed {
                layer,
                stream,
                activation,
                ..
            } => RoutedExperts::Streamed {
                layer,
                stream,
                activation,
                biases,
            },
            RoutedExperts::Unread => RoutedExperts::Unread,
        })
    }
}

/// Every row of `xs` through the experts its route chose: per row, one output per route, in
/// the route's order. An expert runs once for all the rows that chose it. A streamed layer's
/// chosen experts are fetched as many at a time as the plan's slot pool holds (one token's),
/// so a batch that chose many experts still holds at most that many loaded at once; `meanwhile`
/// (the shared experts' products) runs while the first ones are read, and its value is returned.
pub(crate) fn run_routed<T>(
    experts: &RoutedExperts,
    routes: &[Vec<(usize, f32)>],
    xs: &[Vec<f32>],
    meanwhile: impl FnOnce(&mut StepStats) -> Result<T, ModelError>,
    stats: &mut StepStats,
) -> Result<(RoutedOutputs, T), ModelError> {
    let users = ExpertUsers::of(routes);
    let input = SharedRows::new(xs);
    let mut outputs: RoutedOutputs = routes.iter().map(|r| vec![Vec::new(); r.len()]).collect();
    let value = match experts {
        RoutedExperts::Resident(held) => {
            if let Some(group) = held.first().and_then(|m| m.first().int8_group()) {
                input.prepare(group);
            }
            run_resident_experts(held, &users, &input, &mut outputs, stats)?;
            meanwhile(stats)?
        }
        RoutedExperts::Streamed {
            layer,
            stream,
            activation,
            biases,
        } => {
            let parts = stream
                .map
                .get(*layer)
                .and_then(Option::as_ref)
                .ok_or_else(|| ArtifactError::Tensor {
                    name: format!("layer {layer} experts"),
                    reason: "are streamed but the plan lists none for the layer".into(),
                })?;
            let fetched = StreamedExperts {
                layer: *layer,
                parts,
                stream,
                activation: *activation,
                biases,
            };
            fetched.run(&users, &input, &mut outputs, meanwhile, stats)?
        }
        RoutedExperts::Unread => {
            return Err(ModelError::Artifact(ArtifactError::Tensor {
                name: "routed experts".into(),
                reason: "were only recorded by a dry build, never read".into(),
            }));
        }
    };
    Ok((outputs, value))
}

/// The chosen held experts, each on whichever worker thread takes it: one expert's products
/// are one task instead of each product waking the other workers, and every output has the
/// bits its expert gives it on any thread (rows are computed independently).
fn run_resident_experts(
    held: &[Mlp<QMatrix<'_>>],
    users: &ExpertUsers,
    input: &SharedRows,
    outputs: &mut RoutedOutputs,
    stats: &mut StepStats,
) -> Result<(), ModelError> {
    use rayon::prelude::*;
    let results: Vec<_> = users
        .order
        .par_iter()
        .map(|&e| {
            let expert = held.get(e).ok_or(KernelError::Length {
                what: "experts",
                expected: e + 1,
                actual: held.len(),
            })?;
            let mut own = StepStats::default();
            let outs = users.outputs(e, expert, input, &mut own)?;
            Ok::<_, ModelError>((outs, own))
        })
        .collect();
    for result in results {
        let (outs, own) = result?;
        for ((row, k), out) in outs {
            outputs[row][k] = out;
        }
        stats.add(&own);
    }
    Ok(())
}

/// A streamed layer's chosen experts, fetched `slots` at a time.
struct StreamedExperts<'a> {
    layer: usize,
    parts: &'a [minirun_stream::experts::ExpertParts],
    stream: &'a ExpertStream<'a>,
    activation: Activation,
    biases: &'a [Arc<MlpBiases>],
}

impl StreamedExperts<'_> {
    /// Runs the chosen experts as their reads finish, and `meanwhile` while the first ones are
    /// read (or after, when none was chosen); returns its value.
    fn run<T>(
        &self,
        users: &ExpertUsers,
        input: &SharedRows,
        outputs: &mut [Vec<Vec<f32>>],
        meanwhile: impl FnOnce(&mut StepStats) -> Result<T, ModelError>,
        stats: &mut StepStats,
    ) -> Result<T, ModelError> {
        if users.order.is_empty() {
            return meanwhile(stats);
        }
        let stream = self.stream;
        let mut meanwhile = Some(meanwhile);
        let mut value = None;
        let mut meanwhile_stats = StepStats::default();
        let mut expert_stats = StepStats::default();
        let settled = stream.settle_guess(self.layer, &users.order);
        let mut waited_total = Duration::ZERO;
        let mut guessed = settled.unwrap_or_default();
        expert_stats.expert_guessed += guessed.guessed as u64;
        expert_stats.expert_guess_right += guessed.right as u64;
        for chunk in users.order.chunks(stream.slots.max(1)) {
            let first = meanwhile.take();
            let (out, waited) = with_fetched(
                stream,
                self.layer,
                self.parts,
                chunk,
                &mut guessed,
                || first.map(|f| f(&mut meanwhile_stats)),
                |i, expert, fetch| {
                    let e = chunk[i];
                    let part = &self.parts[e];
                    expert_stats.expert_read_bytes += fetch.read_bytes;
                    expert_stats.direct_reads += fetch.direct_reads;
                    expert_stats.buffered_reads += fetch.buffered_reads;
                    match fetch.hit {
                        true => expert_stats.expert_cache_hits += 1,
                        false => expert_stats.expert_cache_misses += 1,
                    }
                    if fetch.guessed {
                        expert_stats.expert_guess_hits += 1;
                        expert_stats.expert_guess_hit_bytes += fetch.read_bytes;
                    }
                    let matrices = expert
                        .parts()
                        .iter()
                        .zip(part.parts())
                        .map(|(loaded, stored)| loaded.matrix(stored))
                        .collect::<Result<Vec<_>, _>>()?;
                    let projections =
                        part.with_parts(matrices)
                            .ok_or_else(|| ArtifactError::Tensor {
                                name: format!("layer {} expert {e}", self.layer),
                                reason: "was read with another number of projections".into(),
                            })?;
                    let mlp = Mlp {
                        projections,
                        activation: self.activation,
                        biases: self.biases.get(e).cloned(),
                    };
                    users.run(e, &mlp, input, outputs, &mut expert_stats)?;
                    Ok(())
                },
            )?;
            waited_total += waited;
            if let Some(out) = out {
                value = Some(out?);
            }
        }
        // The first chunk ran `meanwhile`, and there was one: the order is not empty.
        let value = value.ok_or_else(|| ArtifactError::Tensor {
            name: format!("layer {} experts", self.layer),
            reason: "no chunk of chosen experts was read".into(),
        })?;
        stats.add(&expert_stats);
        stats.weight_bytes += meanwhile_stats.weight_bytes;
        stats.io_time += waited_total;
        Ok(value)
    }
}
