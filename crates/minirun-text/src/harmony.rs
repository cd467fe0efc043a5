//! gpt-oss's chat format, harmony: the conversation as `<|start|>ROLE<|message|>TEXT<|end|>`
//! turns, and the reply as messages on channels (`analysis` for the reasoning, `final` for the
//! answer), of which a chat shows the final channel's text only.
//!
//! The prompt follows OpenAI's published template with two choices of minirun's own, both
//! allowed by the format: the system message carries no "Current date" line (the template
//! stamps the day it renders, so the same conversation would give other tokens tomorrow), and
//! reasoning effort is the template's default, medium.

/// Harmony's control tokens.
pub const START: &str = "<|start|>";
pub const END: &str = "<|end|>";
pub const MESSAGE: &str = "<|message|>";
pub const CHANNEL: &str = "<|channel|>";
/// Ends the assistant's final message: the reply is complete.
pub const RETURN: &str = "<|return|>";
/// Ends a message that calls a tool: the reply stops for the tool's answer.
pub const CALL: &str = "<|call|>";

/// Every control token the format needs, in the order errors list them.
pub const CONTROLS: [&str; 6] = [START, END, MESSAGE, CHANNEL, RETURN, CALL];

/// The system message of OpenAI's template, less its date line.
const SYSTEM: &str = "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.";

/// `(role, content)` messages as harmony, ready for the assistant's reply: the system message;
/// a first `system` (or `developer`) message's content as the developer's instructions; user
/// turns; earlier assistant turns as their final-channel answers; then `<|start|>assistant`.
/// A message the format has no place for (a system message after the first, a tool's answer
/// with no tool call before it, an unknown role) is refused, naming it: OpenAI's template
/// would drop it silently.
pub fn harmony_chat(messages: &[(String, String)]) -> Result<String, String> {
    let mut out = turn("system", SYSTEM);
    for (index, (role, content)) in messages.iter().enumerate() {
        match role.as_str() {
            "system" | "developer" if index == 0 => out.push_str(&turn(
                "developer",
                &format!("# Instructions\n\n{content}\n\n"),
            )),
            "user" => out.push_str(&turn("user", content)),
            "assistant" => out.push_str(&turn("assistant<|channel|>final", content)),
            other => {
                return Err(format!(
                    "message {index} ({other}): harmony places a system or developer message only first, then user and assistant messages"
                ));
            }
        }
    }
    out.push_str(START);
    out.push_str("assistant");
    Ok(out)
}

fn turn(header: &str, content: &str) -> String {
    format!("{START}{header}{MESSAGE}{content}{END}")
}

/// The ids of harmony's control tokens in one vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarmonyIds {
    pub start: u32,
    pub end: u32,
    pub message: u32,
    pub channel: u32,
    pub return_: u32,
    pub call: u32,
}

impl HarmonyIds {
    /// The ids `id_of` gives the control tokens; the names of those it lacks otherwise.
    pub fn find(id_of: impl Fn(&str) -> Option<u32>) -> Result<HarmonyIds, Vec<&'static str>> {
        let missing: Vec<&str> = CONTROLS
            .into_iter()
            .filter(|t| id_of(t).is_none())
            .collect();
        let id = |t| id_of(t).ok_or_else(|| missing.clone());
        Ok(HarmonyIds {
            start: id(START)?,
            end: id(END)?,
            message: id(MESSAGE)?,
            channel: id(CHANNEL)?,
            return_: id(RETURN)?,
            call: id(CALL)?,
        })
    }

    /// The ids of a reply's text on the final channel: every message's content whose header
    /// names `channel` `final` (as `decode` reads the header), without the control tokens.
    /// Content after the last message began counts while it is still arriving.
    pub fn final_channel(&self, reply: &[u32], decode: impl Fn(&[u32]) -> String) -> Vec<u32> {
        let mut kept = Vec::new();
        let mut header: Vec<u32> = Vec::new();
        let mut in_final = false;
        let mut in_header = true;
        for &id in reply {
            if id == self.start {
                (in_header, in_final) = (true, false);
                header.clear();
            } else if id == self.message && in_header {
                in_header = false;
                in_final = is_final(&header, self.channel, &decode);
            } else if id == self.end || id == self.return_ || id == self.call {
                (in_header, in_final) = (false, false);
            } else if in_header {
                header.push(id);
            } else if in_final {
                kept.push(id);
            }
        }
        kept
    }
}

/// Whether a message header (`assistant<|channel|>final`, or the model's own continuation of
/// `<|start|>assistant`, which starts at `<|channel|>`) names the final channel.
fn is_final(header: &[u32], channel: u32, decode: &impl Fn(&[u32]) -> String) -> bool {
    let Some(at) = header.iter().position(|&id| id == channel) else {
        return false;
    };
    let name = decode(&header[at + 1..]);
    name.split_whitespace().next() == Some("final")
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: HarmonyIds = HarmonyIds {
        start: 1,
        end: 2,
        message: 3,
        channel: 4,
        return_: 5,
        call: 6,
    };

    /// Words are ids 10 and up: 10 "analysis", 11 "final", 12 "assistant", 13.. text.
    fn words(ids: &[u32]) -> String {
        ids.iter()
            .map(|id| match id {
                10 => "analysis".to_string(),
                11 => "final".to_string(),
                12 => "assistant".to_string(),
                n => format!("w{n}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn only_the_final_channels_content_is_the_reply() {
        // <|channel|>analysis<|message|>13 14<|end|><|start|>assistant<|channel|>final<|message|>15 16<|return|>
        let reply = [4, 10, 3, 13, 14, 2, 1, 12, 4, 11, 3, 15, 16, 5];
        assert_eq!(IDS.final_channel(&reply, words), [15, 16]);
        // Still arriving: the final message's content so far.
        assert_eq!(IDS.final_channel(&reply[..12], words), [15]);
        // A reply cut off while reasoning has no answer yet.
        assert_eq!(IDS.final_channel(&reply[..5], words), Vec::<u32>::new());
    }

    #[test]
    fn a_message_without_a_channel_or_on_another_is_not_the_reply() {
        assert!(IDS.final_channel(&[3, 13, 2], words).is_empty());
        assert!(IDS.final_channel(&[4, 10, 3, 13, 6], words).is_empty());
    }

    #[test]
    fn the_prompt_is_harmony_turns_ending_where_the_assistant_speaks() {
        let messages = [
            ("system".to_string(), "Be brief.".to_string()),
            ("user".to_string(), "Hi".to_string()),
            ("assistant".to_string(), "Hello.".to_string()),
            ("user".to_string(), "Bye".to_string()),
        ];
        let rendered = harmony_chat(&messages).unwrap();
        assert!(rendered.starts_with("<|start|>system<|message|>You are ChatGPT"));
        assert!(!rendered.contains("Current date"));
        assert!(rendered.ends_with(
            "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|end|><|start|>user<|message|>Bye<|end|><|start|>assistant"
        ));
    }

    #[test]
    fn a_message_the_format_cannot_place_is_refused() {
        let late_system = [
            ("user".to_string(), "Hi".to_string()),
            ("system".to_string(), "Be brief.".to_string()),
        ];
        let refused = harmony_chat(&late_system).unwrap_err();
        assert!(refused.contains("message 1 (system)"), "{refused}");
        assert!(harmony_chat(&[("tool".to_string(), "{}".to_string())]).is_err());
    }

    #[test]
    fn a_vocabulary_without_the_controls_is_named_what_it_lacks() {
        let missing = HarmonyIds::find(|t| (t == START).then_some(7)).unwrap_err();
        assert_eq!(missing, [END, MESSAGE, CHANNEL, RETURN, CALL]);
    }
}
