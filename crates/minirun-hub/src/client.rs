//! The HTTP side: one endpoint, an optional token, API requests that never leave the
//! endpoint's origin, and the tree, revision and catalog calls.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::time::Duration;

use minirun_format::identity::{is_canonical_repo_id, is_pinned_revision};
use serde_json::Value;
use sha2::{Digest, Sha256};
use url::Url;

use crate::error::HubError;
use minirun_format::tree::{Tree, TreeBuilder, check_complete};

/// The public Hub, used when neither `--endpoint` nor `HF_ENDPOINT` says otherwise.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Most pages a listing may have.
const MAX_PAGES: usize = 100_000;
/// Longest `rel="next"` link followed. A page is remembered (to refuse a loop) by its URL's
/// SHA-256, so the pages seen cost `MAX_PAGES` x 32 bytes whatever the links' length.
const MAX_LINK_BYTES: usize = 8 << 10;
/// Most `-minirun` repositories a catalog listing may name.
const MAX_CATALOG_ENTRIES: usize = 100_000;
/// Most bytes one API answer may have.
const MAX_ANSWER_BYTES: u64 = 64 << 20;
const MAX_REDIRECTS: usize = 5;

fn check_repo_id(repo: &str) -> Result<(), HubError> {
    if is_canonical_repo_id(repo) {
        Ok(())
    } else {
        Err(HubError::BadRepoId(repo.to_string()))
    }
}

/// One artifact of an account's catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// `owner/<name>-minirun`.
    pub repo: String,
    /// The name without `-minirun`.
    pub name: String,
    /// The commit the listing reported.
    pub sha: String,
}

/// A Hub client.
#[derive(Debug, Clone)]
pub struct Hub {
    base: Url,
    token: Option<String>,
    agent: ureq::Agent,
}

/// Whether two URLs share scheme, host and port.
pub(crate) fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

impl Hub {
    /// A client of `endpoint` (scheme, host and port; a path is refused), with `token` sent
    /// as a bearer token to that origin only.
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Hub, HubError> {
        let bad = |reason: &str| HubError::BadEndpoint {
            endpoint: endpoint.to_string(),
            reason: reason.to_string(),
        };
        let base = Url::parse(endpoint).map_err(|e| bad(&e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(bad("it needs http:// or https:// and a host"));
        }
        if base.path() != "/" || base.query().is_some() {
            return Err(bad("give the origin only, without a path or query"));
        }
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(120))
            .user_agent(concat!("minirun/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Hub { base, token, agent })
    }

    /// The endpoint from `flag`, else `HF_ENDPOINT`, else the public Hub; the token from
    /// `HF_TOKEN` when set and non-empty.
    pub fn from_env(flag: Option<&str>) -> Result<Hub, HubError> {
        let from_env = std::env::var("HF_ENDPOINT").ok();
        let endpoint = flag
            .map(str::to_string)
            .or(from_env)
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        Hub::new(endpoint.trim_end_matches('/'), token)
    }

    pub fn endpoint(&self) -> &Url {
        &self.base
    }

    pub(crate) fn url(&self, path: &str) -> Result<Url, HubError> {
        self.base.join(path).map_err(|e| HubError::BadEndpoint {
            endpoint: self.base.to_string(),
            reason: e.to_string(),
        })
    }

    /// Sends GET `url` (with `range`, if any), following redirects: within the origin always,
    /// to another origin only when `may_leave_origin` (file content), and then without the
    /// token. Returns the final response and the first response's headers of interest.
    pub(crate) fn get(
        &self,
        url: &Url,
        range: Option<u64>,
        may_leave_origin: bool,
    ) -> Result<(ureq::Response, Option<String>), HubError> {
        let mut current = url.clone();
        let mut first_commit = None;
        for hop in 0..=MAX_REDIRECTS {
            let mut request = self.agent.request_url("GET", &current);
            if same_origin(&current, &self.base)
                && let Some(token) = &self.token
            {
                request = request.set("Authorization", &format!("Bearer {token}"));
            }
            if let Some(from) = range {
                request = request.set("Range", &format!("bytes={from}-"));
            }
            let response = match request.call() {
                Ok(r) => r,
                Err(ureq::Error::Status(404, _)) => {
                    return Err(HubError::NotFound {
                        url: current.to_string(),
                    });
                }
                Err(ureq::Error::Status(status, r)) => {
                    let mut message = String::new();
                    let _ = r.into_reader().take(512).read_to_string(&mut message);
                    return Err(HubError::Http {
                        url: current.to_string(),
                        status,
                        message: message.trim().to_string(),
                    });
                }
                Err(e) => {
                    return Err(HubError::Transport {
                        url: current.to_string(),
                        error: e.to_string(),
                    });
                }
            };
            if hop == 0 {
                first_commit = response.header("x-repo-commit").map(str::to_string);
            }
            if !(300..400).contains(&response.status()) {
                return Ok((response, first_commit));
            }
            let location = response.header("location").unwrap_or_default().to_string();
            let next = current.join(&location).map_err(|e| HubError::BadAnswer {
                url: current.to_string(),
                reason: format!("a redirect to {location:?}: {e}"),
            })?;
            if !same_origin(&next, &self.base) && !may_leave_origin {
                return Err(HubError::RedirectOffOrigin {
                    from: current.to_string(),
                    to: next.to_string(),
                });
            }
            current = next;
        }
        Err(HubError::TooManyRedirects {
            from: url.to_string(),
        })
    }

    /// GET an API URL and read the body (bounded), with the `Link: rel="next"` target.
    fn get_api(&self, url: &Url) -> Result<(Vec<u8>, Option<String>), HubError> {
        let (response, _) = self.get(url, None, false)?;
        let next = response.header("link").and_then(next_link);
        let body = regular_file::read_at_most(response.into_reader(), MAX_ANSWER_BYTES)
            .map_err(|e| HubError::Transport {
                url: url.to_string(),
                error: e.to_string(),
            })?
            .ok_or_else(|| HubError::BadAnswer {
                url: url.to_string(),
                reason: format!("more than {MAX_ANSWER_BYTES} bytes"),
            })?;
        Ok((body, next))
    }

    /// Follows `first` and its `rel="next"` links (same origin and path, never a page twice),
    /// handing each page's body to `page`.
    fn paginate(
        &self,
        first: Url,
        allowed_query: Option<&[&str]>,
        mut page: impl FnMut(&Url, &[u8]) -> Result<(), HubError>,
    ) -> Result<(), HubError> {
        let mut visited = BTreeSet::new();
        let mut next = Some(first.clone());
        while let Some(url) = next.take() {
            if visited.len() >= MAX_PAGES {
                return Err(bad_page(&first, &url, "more pages than any listing has"));
            }
            if !visited.insert(<[u8; 32]>::from(Sha256::digest(url.as_str()))) {
                return Err(bad_page(&first, &url, "a page seen before"));
            }
            let (body, link) = self.get_api(&url)?;
            page(&url, &body)?;
            if let Some(link) = link {
                if link.len() > MAX_LINK_BYTES {
                    return Err(bad_page(
                        &first,
                        &url,
                        "a next link longer than any listing uses",
                    ));
                }
                let target = url
                    .join(&link)
                    .map_err(|_| bad_page(&first, &url, "not a URL"))?;
                if !same_origin(&target, &first) {
                    return Err(bad_page(&first, &target, "another origin"));
                }
                if target.path() != first.path() {
                    return Err(bad_page(&first, &target, "another path"));
                }
                if let Some(allowed) = allowed_query
                    && target
                        .query_pairs()
                        .any(|(k, _)| !allowed.contains(&k.as_ref()))
                {
                    return Err(bad_page(&first, &target, "an unexpected query parameter"));
                }
                next = Some(target);
            }
        }
        Ok(())
    }

    /// The complete file tree of `repo` at the pinned `revision`, checked against the
    /// revision's sibling list.
    pub fn tree(&self, repo: &str, revision: &str) -> Result<Tree, HubError> {
        check_repo_id(repo)?;
        if !is_pinned_revision(revision) {
            return Err(HubError::NotPinned(revision.to_string()));
        }
        let first = self.url(&format!(
            "/api/models/{repo}/tree/{revision}?recursive=1&expand=1"
        ))?;
        let mut builder = TreeBuilder::default();
        self.paginate(first, None, |_, body| Ok(builder.add_page(body)?))?;
        let tree = builder.finish(repo, revision);
        check_complete(&tree, &self.siblings(repo, revision)?)?;
        Ok(tree)
    }

    /// The file names the revision endpoint lists for the pinned `revision`.
    pub fn siblings(&self, repo: &str, revision: &str) -> Result<BTreeSet<String>, HubError> {
        let url = self.url(&format!(
            "/api/models/{repo}/revision/{revision}?expand=sha&expand=siblings"
        ))?;
        let (body, _) = self.get_api(&url)?;
        let bad = |reason: &str| HubError::BadAnswer {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let value: Value = serde_json::from_slice(&body).map_err(|e| bad(&e.to_string()))?;
        let sha = value
            .get("sha")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no sha"))?;
        if sha != revision {
            return Err(HubError::RevisionMismatch {
                expected: revision.to_string(),
                found: sha.to_string(),
            });
        }
        let siblings = value
            .get("siblings")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no siblings"))?;
        siblings
            .iter()
            .map(|s| {
                s.get("rfilename")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| bad("a sibling without rfilename"))
            })
            .collect()
    }

    /// The `owner/<name>-minirun` repositories of `author`, with the commit each listing gave.
    pub fn catalog(&self, author: &str) -> Result<Vec<CatalogEntry>, HubError> {
        check_repo_id(&format!("{author}/x"))?;
        let mut first = self.url("/api/models")?;
        first
            .query_pairs_mut()
            .append_pair("author", author)
            .append_pair("expand", "sha");
        let mut found: BTreeMap<String, CatalogEntry> = BTreeMap::new();
        let allowed: &[&str] = &["author", "expand", "cursor", "p", "limit"];
        self.paginate(first, Some(allowed), |url, body| {
            let bad = |reason: String| HubError::BadAnswer {
                url: url.to_string(),
                reason,
            };
            let value: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
            let models = value.as_array().ok_or_else(|| bad("not an array".into()))?;
            for model in models {
                let Some(id) = model.get("id").and_then(Value::as_str) else {
                    return Err(bad("a model without an id".into()));
                };
                let Some(name) = id
                    .strip_prefix(author)
                    .and_then(|rest| rest.strip_prefix('/'))
                    .and_then(|rest| rest.strip_suffix("-minirun"))
                    .filter(|n| !n.is_empty() && !n.contains('/'))
                else {
                    continue;
                };
                let sha = model
                    .get("sha")
                    .and_then(Value::as_str)
                    .filter(|s| is_pinned_revision(s))
                    .ok_or_else(|| bad(format!("{id} has no commit sha")))?;
                let entry = CatalogEntry {
                    repo: id.to_string(),
                    name: name.to_string(),
                    sha: sha.to_string(),
                };
                if let Some(previous) = found.get(id)
                    && previous.sha != entry.sha
                {
                    return Err(HubError::CatalogConflict {
                        id: id.to_string(),
                        a: previous.sha.clone(),
                        b: entry.sha,
                    });
                }
                found.insert(id.to_string(), entry);
                if found.len() > MAX_CATALOG_ENTRIES {
                    return Err(bad(format!(
                        "more than {MAX_CATALOG_ENTRIES} -minirun repositories, far more than any author publishes"
                    )));
                }
            }
            Ok(())
        })?;
        Ok(found.into_values().collect())
    }
}

fn bad_page(first: &Url, next: &Url, reason: &'static str) -> HubError {
    HubError::BadPagination {
        first: first.to_string(),
        next: next.to_string(),
        reason,
    }
}

/// The target of `rel="next"` in a `Link` header.
pub(crate) fn next_link(header: &str) -> Option<String> {
    let mut rest = header;
    while let Some(open) = rest.find('<') {
        let close = open + rest[open..].find('>')?;
        let target = &rest[open + 1..close];
        let params_end = rest[close..].find('<').map_or(rest.len(), |i| close + i);
        let params = &rest[close + 1..params_end];
        if params
            .split(';')
            .map(|p| p.trim_matches(|c: char| c == ',' || c.is_whitespace()))
            .any(|p| matches!(p, "rel=\"next\"" | "rel=next"))
        {
            return Some(target.to_string());
        }
        rest = &rest[params_end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_link_is_found_among_others() {
        let header = r#"<https://h.co/api/models?cursor=abc&author=x>; rel="next", <https://h.co/x>; rel="xet-auth""#;
        assert_eq!(
            next_link(header).as_deref(),
            Some("https://h.co/api/models?cursor=abc&author=x")
        );
        assert_eq!(next_link(r#"<https://h.co/x>; rel="prev""#), None);
        assert_eq!(next_link("garbage"), None);
    }

    #[test]
    fn repo_ids_and_endpoints_are_checked() {
        assert!(check_repo_id("nanguoyu/Kimi-K3-minirun").is_ok());
        for bad in ["a", "a/b/c", "../b", "a/..", "a/b c", "/b"] {
            assert!(check_repo_id(bad).is_err(), "{bad}");
        }
        assert!(Hub::new("https://huggingface.co", None).is_ok());
        assert!(Hub::new("https://huggingface.co/api", None).is_err());
        assert!(Hub::new("ftp://x", None).is_err());
    }
}
