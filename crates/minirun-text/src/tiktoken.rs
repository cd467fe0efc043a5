//! Kimi K3's tokenizer: a `tiktoken.model` vocabulary, K3's split pattern (run by
//! `fancy-regex`: it needs class intersection and look-ahead), byte-pair merges by rank, the 256
//! reserved special ids after the mergeable ones, and the no-thinking chat template. Encodes as
//! tiktoken's `encode_ordinary` does with that pattern.

use std::collections::HashMap;

use base64::Engine;

use crate::error::TextError;

/// K3's split pattern: Han runs; two case-shaped letter runs (Han subtracted) with optional
/// English contractions; up to three digits; punctuation runs; newline runs; trailing spaces;
/// spaces.
pub const K3_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Reserved ids follow the mergeable tokens.
pub const RESERVED: usize = 256;

/// The named reserved ids, by offset past the mergeable tokens; the others are
/// `<|reserved_token_ID|>`.
const NAMED: &[(usize, &str)] = &[
    (0, "[BOS]"),
    (1, "[EOS]"),
    (2, "<|end_of_msg|>"),
    (3, "<|open|>"),
    (4, "<|close|>"),
    (5, "<|sep|>"),
    (6, "[start_header_id]"),
    (7, "[end_header_id]"),
    (9, "[EOT]"),
    (18, "<|media_begin|>"),
    (19, "<|media_content|>"),
    (20, "<|media_end|>"),
    (21, "<|media_pad|>"),
    (65, "<osagent_mode>"),
    (254, "[UNK]"),
    (255, "[PAD]"),
];

/// A vocabulary far larger than any published one (K3's is 163,584) is refused before it is
/// held.
const MAX_TOKENS: usize = 1 << 21;
const MAX_TOKEN_BYTES: usize = 1 << 10;

pub struct KimiText {
    ranks: HashMap<Vec<u8>, u32>,
    tokens: Vec<Vec<u8>>,
    specials: Vec<String>,
    pattern: fancy_regex::Regex,
}

fn bad(line: usize, why: impl std::fmt::Display) -> TextError {
    TextError::Tiktoken(format!("tiktoken.model line {line}: {why}"))
}

impl KimiText {
    /// Reads a `tiktoken.model`: UTF-8 lines `base64(bytes) SP rank`, ranks 0, 1, 2, ...
    /// without gaps, every token distinct, all 256 single bytes present.
    pub fn parse(model: &[u8]) -> Result<KimiText, TextError> {
        let text = std::str::from_utf8(model)
            .map_err(|_| TextError::Tiktoken("tiktoken.model is not UTF-8 text".into()))?;
        let mut tokens = Vec::new();
        let mut ranks = HashMap::new();
        for (n, line) in text.split('\n').enumerate().filter(|(_, l)| !l.is_empty()) {
            let line_no = n + 1;
            if tokens.len() >= MAX_TOKENS {
                return Err(bad(line_no, format!("more than {MAX_TOKENS} tokens")));
            }
            let (encoded, rank) = line
                .split_once(' ')
                .ok_or_else(|| bad(line_no, "not `base64 rank`"))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| bad(line_no, format!("the token is not base64 ({e})")))?;
            if bytes.is_empty() || bytes.len() > MAX_TOKEN_BYTES {
                return Err(bad(line_no, format!("a token of {} bytes", bytes.len())));
            }
            if rank.parse::<usize>().ok() != Some(tokens.len()) {
                return Err(bad(
                    line_no,
                    format!("rank {rank:?} where {} comes next", tokens.len()),
                ));
            }
            if ranks.insert(bytes.clone(), tokens.len() as u32).is_some() {
                return Err(bad(line_no, "the token is listed twice"));
            }
            tokens.push(bytes);
        }
        if let Some(byte) = (0..=255u8).find(|b| !ranks.contains_key(&[*b][..])) {
            return Err(TextError::Tiktoken(format!(
                "tiktoken.model has no token for the byte {byte:#04x}: some text could not be encoded"
            )));
        }
        let base = tokens.len();
        let specials = (0..RESERVED)
            .map(|k| match NAMED.iter().find(|(offset, _)| *offset == k) {
                Some((_, name)) => name.to_string(),
                None => format!("<|reserved_token_{}|>", base + k),
            })
            .collect();
        let pattern = fancy_regex::Regex::new(K3_PATTERN)
            .map_err(|e| TextError::Tiktoken(format!("K3's split pattern: {e}")))?;
        Ok(KimiText {
            ranks,
            tokens,
            specials,
            pattern,
        })
    }

    /// Mergeable tokens and reserved ids.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len() + RESERVED
    }

    /// The id of a reserved token by name.
    pub fn special_id(&self, name: &str) -> Option<u32> {
        let k = self.specials.iter().position(|s| s == name)?;
        Some((self.tokens.len() + k) as u32)
    }

    /// Ordinary text as ids. Text that spells a reserved token is refused: it would read as
    /// that control token to a reader of the text, but encode as plain bytes.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        if let Some(name) = self.specials.iter().find(|s| text.contains(s.as_str())) {
            return Err(TextError::Tiktoken(format!(
                "the text contains {name:?}, one of K3's reserved tokens; remove it (control tokens come only from the chat template)"
            )));
        }
        let mut ids = Vec::new();
        let mut covered = 0;
        for found in self.pattern.find_iter(text) {
            let piece = found.map_err(|e| {
                TextError::Tiktoken(format!("K3's split pattern gave up on the text: {e}"))
            })?;
            if piece.start() != covered {
                return Err(TextError::Tiktoken(format!(
                    "K3's split pattern matched nothing at byte {covered} of the text"
                )));
            }
            covered = piece.end();
            self.merge(piece.as_str().as_bytes(), &mut ids);
        }
        if covered != text.len() {
            return Err(TextError::Tiktoken(format!(
                "K3's split pattern matched nothing at byte {covered} of the text"
            )));
        }
        Ok(ids)
    }

    /// One piece's ids: the piece itself when it is a token, else its bytes merged pair by
    /// pair, always the adjacent pair whose merge has the lowest rank (the leftmost on ties).
    fn merge(&self, piece: &[u8], ids: &mut Vec<u32>) {
        if let Some(&id) = self.ranks.get(piece) {
            ids.push(id);
            return;
        }
        let mut starts: Vec<usize> = (0..=piece.len()).collect();
        loop {
            let best = (0..starts.len().saturating_sub(2))
                .filter_map(|i| {
                    let rank = self.ranks.get(&piece[starts[i]..starts[i + 2]])?;
                    Some((*rank, i))
                })
                .min();
            match best {
                Some((_, i)) => {
                    starts.remove(i + 1);
                }
                None => break,
            }
        }
        for w in starts.windows(2) {
            // Every single byte is a token (checked at parse) and every merge made one.
            if let Some(&id) = self.ranks.get(&piece[w[0]..w[1]]) {
                ids.push(id);
            }
        }
    }

    /// Ids as text: the tokens' bytes joined, then read as UTF-8 (an invalid sequence becomes
    /// U+FFFD); a reserved id reads as its name.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let id = id as usize;
            match (
                self.tokens.get(id),
                self.specials.get(id.wrapping_sub(self.tokens.len())),
            ) {
                (Some(token), _) => bytes.extend_from_slice(token),
                (None, Some(name)) => bytes.extend_from_slice(name.as_bytes()),
                (None, None) => {
                    return Err(TextError::Tiktoken(format!(
                        "id {id} is outside the vocabulary of {}",
                        self.vocab_size()
                    )));
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// What ends a reply: `[EOS]`, `<|end_of_msg|>` and `<|close|>`.
    pub fn stop_ids(&self) -> Vec<u32> {
        ["[EOS]", "<|end_of_msg|>", "<|close|>"]
            .iter()
            .filter_map(|name| self.special_id(name))
            .collect()
    }

    /// `(role, content)` messages in K3's no-thinking template, then the opening of the
    /// assistant's reply: control tokens as ids, each text segment encoded on its own. No BOS.
    pub fn chat_ids(&self, messages: &[(String, String)]) -> Result<Vec<u32>, TextError> {
        let mut ids = Vec::new();
        let control = |ids: &mut Vec<u32>, name: &str| -> Result<(), TextError> {
            let id = self
                .special_id(name)
                .ok_or_else(|| TextError::Tiktoken(format!("the vocabulary has no {name}")))?;
            ids.push(id);
            Ok(())
        };
        let text = |ids: &mut Vec<u32>, s: &str| -> Result<(), TextError> {
            ids.extend(self.encode(s)?);
            Ok(())
        };
        let open = |ids: &mut Vec<u32>, what: &str| -> Result<(), TextError> {
            control(ids, "<|open|>")?;
            text(ids, what)
        };
        for (role, content) in messages {
            if !matches!(role.as_str(), "system" | "user" | "assistant") {
                return Err(TextError::Template(format!(
                    "K3's chat template has no role {role:?} (only system, user and assistant)"
                )));
            }
            open(&mut ids, "message")?;
            text(&mut ids, &format!(" role=\"{}\"", escape_attribute(role)))?;
            control(&mut ids, "<|sep|>")?;
            if role == "assistant" {
                open(&mut ids, "response")?;
                control(&mut ids, "<|sep|>")?;
                text(&mut ids, content)?;
                control(&mut ids, "<|close|>")?;
                text(&mut ids, "response")?;
                control(&mut ids, "<|sep|>")?;
            } else {
                text(&mut ids, content)?;
            }
            control(&mut ids, "<|close|>")?;
            text(&mut ids, "message")?;
            control(&mut ids, "<|sep|>")?;
            control(&mut ids, "<|end_of_msg|>")?;
        }
        open(&mut ids, "message")?;
        text(&mut ids, " role=\"assistant\"")?;
        control(&mut ids, "<|sep|>")?;
        open(&mut ids, "response")?;
        control(&mut ids, "<|sep|>")?;
        Ok(ids)
    }
}

fn escape_attribute(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}
