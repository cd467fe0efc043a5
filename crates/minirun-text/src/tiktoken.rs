//! Kimi K3's tokenizer: a `tiktoken.model` vocabulary, K3's split pattern (run by
//! `fancy-regex`: it needs class intersection and look-ahead), byte-pair merges by rank, the 256
//! reserved special ids after the mergeable ones, and the no-thinking chat template. Encodes as
//! tiktoken's `encode_ordinary` does with that pattern.
//!
//! The merges run through the `bpe` crate's backtracking encoder, linear in a piece's length:
//! tiktoken's own merge rescans every pair after each merge, so a long run of letters (one
//! split piece) costs time quadratic in its length, and one hostile prompt could hold a
//! server's decode thread for hours.

use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
use std::panic::AssertUnwindSafe;

use bpe::byte_pair_encoding::{BytePairEncoding, find_hash_factor_for_dictionary};

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
    /// The same tokens, ids = ranks, as the linear-time encoder holds them.
    merges: BytePairEncoding,
    longest_token: usize,
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
        let merges = linear_merges(&tokens)?;
        let longest_token = tokens.iter().map(Vec::len).max().unwrap_or(1);
        Ok(KimiText {
            ranks,
            tokens,
            merges,
            longest_token,
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

    /// One piece's ids: the piece itself when it is a token (tiktoken takes it whole, before
    /// any merge), else the byte-pair merges by rank that tiktoken makes, found in linear time.
    fn merge(&self, piece: &[u8], ids: &mut Vec<u32>) {
        match self.ranks.get(piece) {
            Some(&id) => ids.push(id),
            None => ids.extend(self.merges.encode_via_backtracking(piece)),
        }
    }

    /// The most bytes one mergeable token stands for: a text of `n` bytes is at least
    /// `n / longest_token_bytes` tokens, so a prompt can be measured against a context before it
    /// is encoded.
    pub fn longest_token_bytes(&self) -> usize {
        self.longest_token
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

/// The `bpe` crate's encoder over `tokens` (ids = ranks). Its constructor panics on what it
/// cannot hold, and its hash-factor search loops while two tokens share a 64-bit hash, so both
/// are checked here first and a vocabulary it still cannot hold is refused, not crashed on.
fn linear_merges(tokens: &[Vec<u8>]) -> Result<BytePairEncoding, TextError> {
    let mut hashes = HashSet::with_capacity(tokens.len());
    for (rank, token) in tokens.iter().enumerate() {
        if !hashes.insert(token_hash(token)) {
            return Err(TextError::Tiktoken(format!(
                "token {rank} shares its 64-bit FNV hash with an earlier token; the byte-pair encoder cannot index this vocabulary"
            )));
        }
    }
    let factor = find_hash_factor_for_dictionary(tokens.iter().cloned());
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        BytePairEncoding::from_dictionary(tokens.iter().cloned(), Some(factor))
    }))
    .map_err(|_| {
        TextError::Tiktoken(
            "a token of this vocabulary cannot be made by merging its parts in rank order (every byte-pair vocabulary's tokens can): not a byte-pair vocabulary this runtime can encode with".into(),
        )
    })
}

/// The hash the `bpe` crate indexes tokens by before it multiplies in its factor: FNV-1a over
/// the length (8 bytes, little-endian) and the bytes.
fn token_hash(token: &[u8]) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(&(token.len() as u64).to_le_bytes());
    hasher.write(token);
    hasher.finish()
}

fn escape_attribute(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    /// The 256 single bytes, then `extra` merged tokens in rank order.
    fn vocabulary(extra: &[&str]) -> Vec<u8> {
        let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let singles = (0..=255u8).map(|b| encode(&[b]));
        let merged = extra.iter().map(|t| encode(t.as_bytes()));
        singles
            .chain(merged)
            .enumerate()
            .map(|(rank, token)| format!("{token} {rank}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn a_vocabulary_larger_than_the_model_is_refused_naming_its_file() {
        let vocabulary = vocabulary(&["lo"]);
        let text = crate::Text::open(None, None, Some(&vocabulary)).unwrap();
        let ids = text.vocab_size();
        assert!(text.check_fits(ids).is_ok());
        let err = text.check_fits(ids - 1).unwrap_err().to_string();
        let expected = format!("tiktoken.model: the tokenizer has {ids} ids");
        assert!(err.starts_with(&expected), "{err}");
    }

    #[test]
    fn a_mebibyte_long_word_is_one_piece_merged_to_its_largest_tokens() {
        let text = KimiText::parse(&vocabulary(&["lo", "ck", "lock", "locklock"])).unwrap();
        assert_eq!(text.longest_token_bytes(), 8);
        let locklock = 256 + 3;
        for word in ["lock".repeat(1 << 18), "lock".repeat((1 << 18) - 1)] {
            let ids = text.encode(&word).unwrap();
            let whole = word.len() / 8;
            assert_eq!(ids[..whole], vec![locklock; whole][..]);
            assert_eq!(ids.len(), word.len().div_ceil(8));
            assert_eq!(text.decode(&ids).unwrap(), word);
        }
        let shouted = "LOCK".repeat(1 << 18);
        assert_eq!(text.encode(&shouted).unwrap().len(), shouted.len());
    }

    #[test]
    fn a_token_no_merge_can_make_is_refused_not_crashed_on() {
        // "abc" before "ab" or "bc" exists: byte-pair merges can never produce it.
        let Err(refused) = KimiText::parse(&vocabulary(&["abc"])) else {
            panic!("an unreachable token was accepted");
        };
        assert!(
            refused.to_string().contains("cannot be made by merging"),
            "{refused}"
        );
    }
}
