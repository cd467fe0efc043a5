//! git's and OpenSSH's `allowed_signers` file (ssh-keygen(1), "ALLOWED SIGNERS"): one line per
//! trusted key, `PRINCIPALS [OPTIONS] KEYTYPE BASE64 [COMMENT]`, with the options
//! `namespaces="..."`, `valid-after=...`, `valid-before=...` and `cert-authority`.

use ssh_key::PublicKey;

/// The most bytes an allowed-signers file may have.
pub const MAX_ALLOWED_SIGNERS_BYTES: u64 = 4 << 20;

/// One trusted key and what it may sign.
#[derive(Debug, Clone)]
pub struct AllowedSigner {
    /// The principals as written (a comma-separated pattern list).
    pub principals: String,
    pub key: PublicKey,
    /// `namespaces="..."`: the patterns the key may sign in; `None` means any.
    pub namespaces: Option<Vec<String>>,
    /// Seconds since the Unix epoch (UTC).
    pub valid_after: Option<i64>,
    pub valid_before: Option<i64>,
    /// A certificate authority's key: it vouches for certificates, never signs a statement
    /// itself, so it matches no plain-key signature.
    pub cert_authority: bool,
    /// The line it was read from (1-based), for messages.
    pub line: usize,
}

/// Why an allowed-signers file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowedSignersError {
    #[error("allowed signers line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("the allowed signers file is not UTF-8 text")]
    NotText,
}

/// Reads every line of an allowed-signers file; blank lines and `#` comments are skipped.
pub fn parse(text: &[u8]) -> Result<Vec<AllowedSigner>, AllowedSignersError> {
    let text = std::str::from_utf8(text).map_err(|_| AllowedSignersError::NotText)?;
    let mut signers = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_number = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let signer =
            parse_line(trimmed, line_number).map_err(|reason| AllowedSignersError::BadLine {
                line: line_number,
                reason,
            })?;
        signers.push(signer);
    }
    Ok(signers)
}

fn parse_line(line: &str, number: usize) -> Result<AllowedSigner, String> {
    let tokens = split_fields(line)?;
    let principals = tokens
        .first()
        .map(|p| p.trim_matches('"').to_string())
        .filter(|p| !p.is_empty())
        .ok_or("no principals")?;
    let (options, key_at) = match tokens.get(1) {
        Some(t) if is_key_type(t) => (None, 1),
        Some(t) => (Some(t.as_str()), 2),
        None => return Err("no key".into()),
    };
    let key_text = tokens
        .get(key_at..key_at + 2)
        .ok_or("expected a key type and its base64 after the principals")?
        .join(" ");
    let key = PublicKey::from_openssh(&key_text).map_err(|e| format!("not a public key: {e}"))?;
    let mut signer = AllowedSigner {
        principals,
        key,
        namespaces: None,
        valid_after: None,
        valid_before: None,
        cert_authority: false,
        line: number,
    };
    for option in options.map(split_options).unwrap_or_default() {
        apply_option(&mut signer, &option)?;
    }
    Ok(signer)
}

fn is_key_type(token: &str) -> bool {
    token.starts_with("ssh-") || token.starts_with("ecdsa-") || token.starts_with("sk-")
}

/// Whitespace-separated fields, a double-quoted run kept whole (quotes included).
fn split_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !current.is_empty() {
                    fields.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if quoted {
        return Err("an unterminated quote".into());
    }
    if !current.is_empty() {
        fields.push(current);
    }
    Ok(fields)
}

/// Comma-separated options, a comma inside quotes kept.
fn split_options(options: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in options.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    out.push(current);
    out
}

fn apply_option(signer: &mut AllowedSigner, option: &str) -> Result<(), String> {
    let (name, value) = match option.split_once('=') {
        Some((n, v)) => (n.to_ascii_lowercase(), Some(v)),
        None => (option.to_ascii_lowercase(), None),
    };
    match (name.as_str(), value) {
        ("cert-authority", None) => signer.cert_authority = true,
        ("namespaces", Some(v)) => {
            signer.namespaces = Some(v.split(',').map(str::to_string).collect());
        }
        ("valid-after", Some(v)) => signer.valid_after = Some(utc_time(v)?),
        ("valid-before", Some(v)) => signer.valid_before = Some(utc_time(v)?),
        _ => {
            return Err(format!(
                "option {option:?} is not one this build knows (cert-authority, namespaces, valid-after, valid-before)"
            ));
        }
    }
    Ok(())
}

/// `YYYYMMDD[HHMM[SS]]Z` as seconds since the epoch. Without the `Z`, ssh-keygen reads the time
/// in the local time zone; this build refuses it rather than guess the zone.
fn utc_time(value: &str) -> Result<i64, String> {
    let digits = value.strip_suffix(['Z', 'z']).ok_or_else(|| {
        format!(
            "time {value:?} has no trailing Z: write it in UTC as YYYYMMDD[HHMM[SS]]Z (ssh-keygen reads a time without Z in the local zone, which this build does not guess)"
        )
    })?;
    let bad = || format!("time {value:?} is not YYYYMMDD[HHMM[SS]]Z");
    if !matches!(digits.len(), 8 | 12 | 14) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let number = |range: std::ops::Range<usize>| -> i64 {
        digits.get(range).and_then(|d| d.parse().ok()).unwrap_or(0)
    };
    let (year, month, day) = (number(0..4), number(4..6), number(6..8));
    let (hour, minute, second) = (number(8..10), number(10..12), number(12..14));
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err(bad());
    }
    Ok(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Whether `text` matches an OpenSSH pattern (`*` any run, `?` one character).
pub(crate) fn matches_pattern(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINEoICEMawsVsk7QFRbDyLo4jp98L9yii5I6nNCTNvk8";

    #[test]
    fn lines_with_and_without_options_comments_and_quotes_are_read() {
        let text = format!(
            "# trusted publishers\n\nalice@example {KEY} a comment\n\"bob@example,carol@example\" namespaces=\"git,minirun-*\",valid-after=20260101Z,valid-before=202701011200Z {KEY}\n*@example cert-authority {KEY}\n"
        );
        let signers = parse(text.as_bytes()).unwrap();
        assert_eq!(signers.len(), 3);
        assert_eq!(signers[0].principals, "alice@example");
        assert_eq!(signers[0].namespaces, None);
        assert_eq!(signers[0].line, 3);
        assert_eq!(signers[1].principals, "bob@example,carol@example");
        assert_eq!(
            signers[1].namespaces.as_deref(),
            Some(&["git".to_string(), "minirun-*".to_string()][..])
        );
        assert_eq!(signers[1].valid_after, Some(1_767_225_600));
        assert_eq!(signers[1].valid_before, Some(1_798_804_800));
        assert!(signers[2].cert_authority);
    }

    #[test]
    fn unknown_options_local_times_and_bad_keys_are_refused_naming_the_line() {
        for (line, expected) in [
            (format!("a@b restrict {KEY}"), "not one this build knows"),
            (format!("a@b valid-before=20270101 {KEY}"), "no trailing Z"),
            (
                format!("a@b valid-before=2027011Z {KEY}"),
                "is not YYYYMMDD",
            ),
            ("a@b ssh-ed25519 AAAA".to_string(), "not a public key"),
            ("a@b".to_string(), "no key"),
            (format!("\"\" {KEY}"), "no principals"),
        ] {
            let err = parse(format!("\n{line}\n").as_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("allowed signers line 2: "), "{err}");
            assert!(err.contains(expected), "{line}: {err}");
        }
    }

    #[test]
    fn patterns_match_as_openssh_matches_them() {
        assert!(matches_pattern("minirun-*", "minirun-artifact"));
        assert!(matches_pattern("*", "anything"));
        assert!(matches_pattern("git", "git"));
        assert!(matches_pattern("m?n*t", "minirun-artifact"));
        assert!(!matches_pattern("git", "minirun-artifact"));
        assert!(!matches_pattern("minirun-artifact?", "minirun-artifact"));
    }

    #[test]
    fn dates_count_days_from_the_epoch() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(utc_time("20261205013000Z"), Ok(1_796_434_200));
    }
}
