//! A run's session: an artifact opened through its evidence (or explicitly unverified), its
//! config and tokenizer, prompts turned into ids, and text streamed as it is generated. What
//! `minirun run` does, as a library, so that tests and other front ends call it directly.

pub mod batch;
pub mod generate;
pub mod request;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use minirun_store::{HeldEvidence, SealKey, StoreError};

use crate::engine::config::ConfigError;
use crate::engine::model::Model;
use crate::registry::{self, Architecture};
use crate::session::generate::{Figures, Sampling, StepRecord, generate};
use minirun_stream::artifact::{Access, Artifact, ArtifactError};
use minirun_stream::budget::{Budget, human};
use minirun_stream::model_weights::ModelWeights;
use minirun_stream::plan::{Layers, Plan, PlanError};
use minirun_stream::step::ModelError;
use minirun_text::{Text, TextError};

/// Why a session could not be opened or could not generate.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(
        "{0} has no verification evidence, so its bytes are not known to be the published ones.\n\
         Verify it first: `minirun verify {0} --repo OWNER/NAME --revision SHA` (against the publisher), \
         `minirun verify {0} --allowed-signers FILE` (offline, against its publisher's signature) or \
         `minirun verify {0}` (offline, against its own manifests); or run it anyway with --unverified."
    )]
    NoEvidence(String),
    #[error("the verification evidence does not hold: {0}")]
    Evidence(StoreError),
    #[error(
        "{0} was only spot-checked (a sample of its tiles hashed), which does not vouch for the bytes a run reads.\n\
         Verify it in full: `minirun verify {0} --repo OWNER/NAME --revision SHA` (against the publisher) or \
         `minirun verify {0}` (offline, against its own manifests); or run it anyway with --unverified."
    )]
    SpotCheckOnly(String),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(
        "holding {path} resident needs {} and {} is available: give --budget (e.g. --budget {} or --budget floor, at least {}) to stream what does not fit",
        human(*needs), human(*available), human(available / 2), human(*floor)
    )]
    ExceedsMemory {
        path: String,
        needs: u64,
        available: u64,
        floor: u64,
    },
}

/// The evidence mode of a spot check (`minirun verify --spot-check`), which never authorizes a
/// run.
const SPOT_CHECK: &str = "spot-check";

/// What the caller hears after each generated token.
#[derive(Debug, Clone, Copy)]
pub struct TokenEvent<'e> {
    /// Text that became final with this token, if any.
    pub text: Option<&'e str>,
    /// The decode step that produced the token (none for the first, which the prompt produced).
    pub step: Option<&'e StepRecord>,
}

/// Whether a run must be vouched for by verification evidence.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Payload opens only through held evidence sealed under this key (the user's, see
    /// [`SealKey::for_user`]); an artifact without any is refused.
    Verified(SealKey),
    /// The caller said so (`--unverified`); every report says it too.
    Unverified,
}

/// An opened artifact, ready to build its model and generate.
pub struct Session {
    pub path: PathBuf,
    /// Whether payload opens only through held evidence.
    pub verified: bool,
    pub artifact: Artifact,
    pub architecture: Architecture,
    /// Shared so that a server can tokenize prompts on other threads than the one decoding.
    pub text: Arc<Text>,
}

/// What one generation produced.
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    /// The generated ids decoded in full.
    pub text: String,
    /// What was handed to `on_text` while generating (a prefix of `text` unless the tokenizer
    /// rewrote a tail).
    pub streamed: String,
    pub figures: Figures,
}

impl Session {
    /// Opens the artifact at `path` (refusing one without evidence unless `trust` is
    /// [`Trust::Unverified`]), reads its config fail-closed and its tokenizer.
    pub fn open(path: &Path, trust: Trust) -> Result<Session, SessionError> {
        let verified = matches!(trust, Trust::Verified(_));
        let access = match trust {
            Trust::Unverified => Access::Unverified,
            Trust::Verified(key) => match HeldEvidence::load(path, &key) {
                Ok(held) if held.evidence().mode == SPOT_CHECK => {
                    return Err(SessionError::SpotCheckOnly(path.display().to_string()));
                }
                Ok(held) => Access::Verified(Box::new(held)),
                Err(StoreError::NoEvidence { .. }) => {
                    return Err(SessionError::NoEvidence(path.display().to_string()));
                }
                Err(e) => return Err(SessionError::Evidence(e)),
            },
        };
        let artifact = registry::open_artifact(path, access)?;
        let architecture = Architecture::parse(&artifact.config_json)?;
        let text = Text::open(
            artifact.tokenizer_json.as_deref(),
            artifact.tokenizer_config_json.as_deref(),
            artifact.tiktoken_model.as_deref(),
        )?;
        let text = text.with_chat_format(architecture.chat_format())?;
        text.check_fits(architecture.vocab_size())?;
        Ok(Session {
            path: path.to_path_buf(),
            verified,
            artifact,
            architecture,
            text: Arc::new(text),
        })
    }

    /// What the run is, line by line, for the report's header.
    pub fn header(&self) -> Vec<String> {
        let mut lines = vec![
            format!("artifact {}", self.path.display()),
            self.architecture.describe(),
            format!(
                "{} bytes of weights resident",
                self.artifact.payload_bytes()
            ),
            self.artifact.provenance.clone(),
        ];
        if self.artifact.activations() == minirun_kernels::Activations::Int8 {
            lines.push(
                "products: 8-bit activations for affine 4- and 8-bit and MXFP4 matrices (not the f32 path's bits; --activations f32 is exact)"
                    .to_string(),
            );
        }
        lines
    }

    /// The prompt's token ids: a raw prompt gets the tokenizer's BOS; `chat` renders it as one
    /// user message with the artifact's chat template, which carries its own.
    pub fn prompt_ids(&self, prompt: &str, chat: bool) -> Result<Vec<u32>, SessionError> {
        if chat {
            return Ok(self.text.chat_ids(prompt)?);
        }
        Ok(self.text.encode(prompt, true)?)
    }

    /// The ids that end generation: config.json's and the tokenizer config's EOS.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut stop = self.architecture.eos_token_ids().to_vec();
        stop.extend(self.text.stop_ids());
        stop
    }

    /// The model, every weight resident, computing from the artifact's stored bytes.
    pub fn model(&self) -> Result<Model<'_>, SessionError> {
        Ok(self.architecture.load(&self.artifact)?)
    }

    /// The memory plan for `budget` and a context of `context_tokens`, made before any payload
    /// byte is read (a budget below the floor is refused here), with what the model's layers
    /// ask for (the plan's input).
    pub fn plan(
        &self,
        budget: Budget,
        context_tokens: usize,
    ) -> Result<(Plan, ModelWeights), SessionError> {
        self.plan_layers((budget, Layers::HoldWhatFits), context_tokens)
    }

    /// [`Self::plan`] with the layers' deterministic weights held or streamed as the dial's
    /// [`Layers`] says.
    pub fn plan_layers(
        &self,
        dial: (Budget, Layers),
        context_tokens: usize,
    ) -> Result<(Plan, ModelWeights), SessionError> {
        let weights = self
            .architecture
            .weights(&self.artifact)
            .map_err(ModelError::from)?;
        let plan = self
            .architecture
            .plan(&self.artifact, &weights, dial, context_tokens)?;
        Ok((plan, weights))
    }

    /// [`Self::plan_layers`] for weights already listed (by an earlier plan of this session):
    /// other budgets planned for the same model without listing its weights again.
    pub fn plan_for(
        &self,
        weights: &ModelWeights,
        dial: (Budget, Layers),
        context_tokens: usize,
    ) -> Result<Plan, SessionError> {
        Ok(self
            .architecture
            .plan(&self.artifact, weights, dial, context_tokens)?)
    }

    /// The plan for the budget the user gave, or, when they gave none, for everything
    /// resident: refused when that needs more than `available` bytes (the memory free now,
    /// [`minirun_stream::budget::available_memory`]; `None` where the system does not say), rather than
    /// left to swap or to the kernel's out-of-memory killer. A budget the user gave is theirs.
    pub fn plan_within(
        &self,
        (budget, layers): (Option<Budget>, Layers),
        context_tokens: usize,
        available: Option<u64>,
    ) -> Result<(Plan, ModelWeights), SessionError> {
        let dial = (budget.unwrap_or(Budget::Generous), layers);
        let (plan, weights) = self.plan_layers(dial, context_tokens)?;
        if let (None, Some(available)) = (budget, available)
            && plan.budget > available
        {
            return Err(SessionError::ExceedsMemory {
                path: self.path.display().to_string(),
                needs: plan.budget,
                available,
                floor: plan.floor,
            });
        }
        Ok((plan, weights))
    }

    /// The model as `plan` (made from `weights`) says: resident, or with its routed experts
    /// streamed.
    pub fn planned_model(
        &self,
        plan: &Plan,
        weights: &ModelWeights,
    ) -> Result<Model<'_>, SessionError> {
        Ok(self
            .architecture
            .load_planned(&self.artifact, plan, weights)?)
    }

    /// Generates from `prompt_ids`; `on_token` hears, after each token, the text that became
    /// final (see [`IncrementalText`]) and what the step cost.
    pub fn generate(
        &self,
        model: &Model<'_>,
        prompt_ids: &[u32],
        max_tokens: usize,
        sampling: Sampling,
        stop: &[u32],
        on_token: impl FnMut(TokenEvent<'_>),
    ) -> Result<Generation, SessionError> {
        let stream = IncrementalText::new(&self.text);
        self.generate_into(
            stream, model, prompt_ids, max_tokens, sampling, stop, on_token,
        )
    }

    /// [`Self::generate`] for a chat's reply: the text is what the chat format shows of it
    /// (with harmony, the final channel only; see [`Text::reply_ids`]).
    pub fn generate_reply(
        &self,
        model: &Model<'_>,
        prompt_ids: &[u32],
        max_tokens: usize,
        sampling: Sampling,
        stop: &[u32],
        on_token: impl FnMut(TokenEvent<'_>),
    ) -> Result<Generation, SessionError> {
        let stream = IncrementalText::reply(&self.text);
        self.generate_into(
            stream, model, prompt_ids, max_tokens, sampling, stop, on_token,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn generate_into(
        &self,
        mut stream: IncrementalText<'_>,
        model: &Model<'_>,
        prompt_ids: &[u32],
        max_tokens: usize,
        sampling: Sampling,
        stop: &[u32],
        mut on_token: impl FnMut(TokenEvent<'_>),
    ) -> Result<Generation, SessionError> {
        let (generated_ids, figures) = generate(
            model,
            prompt_ids,
            max_tokens,
            sampling,
            stop,
            |token, step| {
                let new = stream.push(token);
                on_token(TokenEvent {
                    text: new.as_deref(),
                    step,
                });
            },
        )?;
        let text = stream.decoded()?;
        Ok(Generation {
            prompt_ids: prompt_ids.to_vec(),
            generated_ids,
            text,
            streamed: stream.shown().to_string(),
            figures,
        })
    }
}

/// Turns ids into text as they arrive, handing out only text that extends what was handed out
/// before: a decode ending in a replacement character may be half of a multi-byte character,
/// and a byte-fallback tokenizer can rewrite a tail it decoded before.
pub struct IncrementalText<'t> {
    text: &'t Text,
    ids: Vec<u32>,
    shown: String,
    /// A chat's reply: only what the chat format shows of it ([`Text::reply_ids`]).
    reply: bool,
}

impl<'t> IncrementalText<'t> {
    /// Every id's text (a completion).
    pub fn new(text: &'t Text) -> Self {
        IncrementalText {
            text,
            ids: Vec::new(),
            shown: String::new(),
            reply: false,
        }
    }

    /// The text a chat shows of a reply.
    pub fn reply(text: &'t Text) -> Self {
        IncrementalText {
            reply: true,
            ..IncrementalText::new(text)
        }
    }

    /// The text of every id pushed so far (of those a chat shows, for a reply).
    pub fn decoded(&self) -> Result<String, minirun_text::TextError> {
        match self.reply {
            true => self.text.decode(&self.text.reply_ids(&self.ids)),
            false => self.text.decode(&self.ids),
        }
    }

    /// Adds one id; returns the new final text, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        self.ids.push(id);
        let now = self.decoded().ok()?;
        if now.ends_with('\u{FFFD}') {
            return None;
        }
        let new = now.strip_prefix(self.shown.as_str())?.to_string();
        self.shown = now;
        (!new.is_empty()).then_some(new)
    }

    /// The ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Everything handed out so far.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}
