//! The Hub client against a real HTTP server on 127.0.0.1 that the test starts: recorded tree
//! pages of a real artifact, a generated repository whose files it serves with Range support,
//! and the misbehaviours a client must survive or refuse (pagination and redirects to another
//! origin, repeated pages, dropped connections, wrong digests, wrong commits, 404s, `..`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};

use minirun_hub::{DownloadOptions, Hub, HubError, TreeError};
use sha2::Digest as _;
use tiny_http::{Header, Response, Server};

const KIMI: &str = "nanguoyu/Kimi-K3-minirun";
const KIMI_PIN: &str = "159987d3ac437e0aceaff0763d43ddeb549b1842";
const REPO: &str = "team/tiny-minirun";
const PIN: &str = "0123456789abcdef0123456789abcdef01234567";

fn data() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hf"))
}

/// How the server misbehaves, set per test.
#[derive(Default)]
struct Behaviour {
    /// Served instead of the real content for these paths.
    wrong_content: BTreeMap<String, Vec<u8>>,
    /// Drop the connection after this many bytes, once per path.
    drop_after: BTreeMap<String, usize>,
    /// X-Repo-Commit to send instead of the pin.
    commit: Option<String>,
    /// The tree's second page links to this URL instead.
    next_link: Option<String>,
    /// The tree endpoint redirects here.
    redirect_tree: Option<String>,
    /// Extra entries on the generated tree's last page.
    extra_entries: Vec<String>,
    /// Ranged requests seen.
    ranges: Vec<String>,
}

struct TestServer {
    base: String,
    behaviour: Arc<Mutex<Behaviour>>,
}

/// The generated repository: a few plain and LFS files.
fn generated_files() -> BTreeMap<String, (Vec<u8>, bool)> {
    let mut files = BTreeMap::new();
    files.insert(
        "index.json".to_string(),
        (b"{\"format\": \"x\"}\n".to_vec(), false),
    );
    files.insert(".gitattributes".to_string(), (Vec::new(), false));
    for (i, size) in [3 << 20, 1 << 20, 777_777].into_iter().enumerate() {
        let content: Vec<u8> = (0..size).map(|j: usize| (j * 31 + i * 7) as u8).collect();
        files.insert(format!("layer0{i}/layer0{i}-w1.mxfp4tile"), (content, true));
    }
    files
}

fn tree_entry(path: &str, content: &[u8], lfs: bool) -> serde_json::Value {
    let blob = {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", content.len()).as_bytes());
        h.update(content);
        hex(&h.finalize())
    };
    if lfs {
        serde_json::json!({"type": "file", "oid": "1111111111111111111111111111111111111111",
            "size": content.len(), "path": path,
            "lfs": {"oid": hex(&sha2::Sha256::digest(content)), "size": content.len(), "pointerSize": 134}})
    } else {
        serde_json::json!({"type": "file", "oid": blob, "size": content.len(), "path": path})
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).unwrap()
}

/// A reader that fails after `limit` bytes (a dropped connection).
struct Dropping {
    data: std::io::Cursor<Vec<u8>>,
    limit: usize,
}

impl Read for Dropping {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.limit.saturating_sub(self.data.position() as usize);
        if left == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "dropped",
            ));
        }
        let n = buf.len().min(left);
        self.data.read(&mut buf[..n])
    }
}

impl TestServer {
    fn start() -> TestServer {
        let server = Server::http("127.0.0.1:0").unwrap();
        let base = format!("http://{}", server.server_addr().to_ip().unwrap());
        let behaviour = Arc::new(Mutex::new(Behaviour::default()));
        let shared = behaviour.clone();
        let origin = base.clone();
        std::thread::spawn(move || {
            for request in server.incoming_requests() {
                let response = answer(&origin, &shared, &request);
                let _ = request.respond(response);
            }
        });
        TestServer { base, behaviour }
    }

    fn hub(&self) -> Hub {
        Hub::new(&self.base, Some("secret".into())).unwrap()
    }
}

type Answer = Response<Box<dyn Read + Send>>;

fn json(status: u16, body: String, extra: Vec<Header>) -> Answer {
    let len = body.len();
    let mut r = Response::new(
        status.into(),
        vec![header("content-type", "application/json")],
        Box::new(std::io::Cursor::new(body.into_bytes())) as Box<dyn Read + Send>,
        Some(len),
        None,
    );
    for h in extra {
        r.add_header(h);
    }
    r
}

fn answer(origin: &str, behaviour: &Mutex<Behaviour>, request: &tiny_http::Request) -> Answer {
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let cursor: usize = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("cursor="))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut b = behaviour.lock().unwrap();
    let tree_prefix = |repo: &str, pin: &str| format!("/api/models/{repo}/tree/{pin}");
    if path == tree_prefix(KIMI, KIMI_PIN) {
        let page = std::fs::read_to_string(
            data().join(format!("Kimi-K3-minirun/tree-page-{:02}.json", cursor + 1)),
        )
        .unwrap();
        let mut links = Vec::new();
        if cursor + 1 < 12 {
            let next = match (&b.next_link, cursor) {
                (Some(link), 1) => link.clone(),
                _ => format!("{origin}{path}?recursive=1&expand=1&cursor={}", cursor + 1),
            };
            links.push(header("link", &format!("<{next}>; rel=\"next\"")));
        }
        return json(200, page, links);
    }
    if path == format!("/api/models/{KIMI}/revision/{KIMI_PIN}") {
        let mut siblings = Vec::new();
        for page in 1..=12 {
            let text = std::fs::read_to_string(
                data().join(format!("Kimi-K3-minirun/tree-page-{page:02}.json")),
            )
            .unwrap();
            let entries: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
            for e in entries.iter().filter(|e| e["type"] == "file") {
                siblings.push(serde_json::json!({"rfilename": e["path"]}));
            }
        }
        return json(
            200,
            serde_json::json!({"sha": KIMI_PIN, "siblings": siblings}).to_string(),
            vec![],
        );
    }
    let files = generated_files();
    if path == tree_prefix(REPO, PIN) {
        if let Some(to) = &b.redirect_tree {
            return json(302, String::new(), vec![header("location", to)]);
        }
        let mut entries: Vec<serde_json::Value> = files
            .iter()
            .map(|(p, (c, lfs))| tree_entry(p, c, *lfs))
            .collect();
        entries.push(serde_json::json!({"type": "directory", "oid": "2222222222222222222222222222222222222222", "size": 0, "path": "layer00"}));
        for extra in &b.extra_entries {
            entries.push(serde_json::json!({"type": "file", "oid": "3333333333333333333333333333333333333333", "size": 1, "path": extra}));
        }
        // Two pages.
        let half = entries.len() / 2;
        let (page, link) = if cursor == 0 {
            (
                &entries[..half],
                Some(format!("{origin}{path}?recursive=1&expand=1&cursor=1")),
            )
        } else {
            (&entries[half..], None)
        };
        let links = link
            .map(|l| header("link", &format!("<{l}>; rel=\"next\"")))
            .into_iter()
            .collect();
        return json(
            200,
            serde_json::Value::Array(page.to_vec()).to_string(),
            links,
        );
    }
    if path == format!("/api/models/{REPO}/revision/{PIN}") {
        let mut names: Vec<String> = files.keys().cloned().collect();
        names.extend(b.extra_entries.iter().cloned());
        let siblings: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({"rfilename": n}))
            .collect();
        return json(
            200,
            serde_json::json!({"sha": PIN, "siblings": siblings}).to_string(),
            vec![],
        );
    }
    if path == "/api/models" {
        let all: Vec<serde_json::Value> = serde_json::from_str(
            &std::fs::read_to_string(data().join("models-full.json")).unwrap(),
        )
        .unwrap();
        let half = all.len() / 2;
        let (page, link) = if cursor == 0 {
            (
                &all[..half],
                Some(format!(
                    "{origin}/api/models?author=nanguoyu&expand=sha&cursor=1"
                )),
            )
        } else {
            (&all[half..], None)
        };
        let links = link
            .map(|l| header("link", &format!("<{l}>; rel=\"next\"")))
            .into_iter()
            .collect();
        return json(
            200,
            serde_json::Value::Array(page.to_vec()).to_string(),
            links,
        );
    }
    if let Some(file) = path.strip_prefix(&format!("/{REPO}/resolve/{PIN}/")) {
        let Some((content, _)) = files.get(file) else {
            return json(404, "{\"error\":\"Entry not found\"}".into(), vec![]);
        };
        let content = b
            .wrong_content
            .get(file)
            .cloned()
            .unwrap_or_else(|| content.clone());
        let commit = b.commit.clone().unwrap_or_else(|| PIN.to_string());
        let range = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Range"))
            .map(|h| h.value.as_str().to_string());
        let from: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        if let Some(r) = &range {
            b.ranges.push(format!("{file} {r}"));
        }
        let body = content[from.min(content.len())..].to_vec();
        let len = body.len();
        let status = if range.is_some() { 206 } else { 200 };
        let limit = b.drop_after.remove(file).unwrap_or(usize::MAX);
        let reader: Box<dyn Read + Send> = Box::new(Dropping {
            data: std::io::Cursor::new(body),
            limit,
        });
        let mut r = Response::new(
            status.into(),
            vec![header("x-repo-commit", &commit)],
            reader,
            Some(len),
            None,
        );
        if range.is_some() {
            r.add_header(header(
                "content-range",
                &format!(
                    "bytes {from}-{}/{}",
                    content.len().saturating_sub(1),
                    content.len()
                ),
            ));
        }
        return r;
    }
    json(404, "{\"error\":\"Repository not found\"}".into(), vec![])
}

#[test]
fn the_recorded_kimi_tree_is_read_whole_with_each_files_published_digest() {
    let server = TestServer::start();
    let tree = server.hub().tree(KIMI, KIMI_PIN).unwrap();
    assert_eq!(tree.files.len(), 471);
    assert_eq!(tree.total_bytes(), 1_559_995_796_586);
    let embed = &tree.files["global/embed_tokens.bin"];
    assert_eq!(
        embed.digest.algorithm(),
        "sha256",
        "LFS: the content's SHA-256, not the pointer's oid"
    );
    assert_eq!(
        embed.digest.hex(),
        "4a79cdabdab6826b994aff69d90a72aa35dae32e90f8acaf1ce312c7bdc4a487"
    );
    assert_eq!(embed.size, 2_348_810_240);
    let attributes = &tree.files[".gitattributes"];
    assert_eq!(attributes.digest.algorithm(), "git-blob-sha1");
    assert_eq!(
        attributes.digest.hex(),
        "9238e45903a3d0f2c30d9b6296165a92219a48ed"
    );
}

#[test]
fn pagination_and_redirects_may_not_leave_the_origin_or_repeat() {
    let server = TestServer::start();
    server.behaviour.lock().unwrap().next_link =
        Some("http://127.0.0.2:9/api/models/x/tree/y?cursor=2".into());
    let err = server.hub().tree(KIMI, KIMI_PIN).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::BadPagination {
                reason: "another origin",
                ..
            }
        ),
        "{err}"
    );

    server.behaviour.lock().unwrap().next_link = Some(format!(
        "{}/api/models/{KIMI}/tree/{KIMI_PIN}?recursive=1&expand=1&cursor=1",
        server.base
    ));
    let err = server.hub().tree(KIMI, KIMI_PIN).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::BadPagination {
                reason: "a page seen before",
                ..
            }
        ),
        "{err}"
    );

    // Every page's URL is kept to refuse a loop, so a link may not be of any length.
    server.behaviour.lock().unwrap().next_link = Some(format!(
        "{}/api/models/{KIMI}/tree/{KIMI_PIN}?recursive=1&expand=1&cursor={}",
        server.base,
        "9".repeat(9000)
    ));
    let err = server.hub().tree(KIMI, KIMI_PIN).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::BadPagination {
                reason: "a next link longer than any listing uses",
                ..
            }
        ),
        "{err}"
    );

    server.behaviour.lock().unwrap().redirect_tree = Some("http://evil.example/api/tree".into());
    let err = server.hub().tree(REPO, PIN).unwrap_err();
    assert!(matches!(err, HubError::RedirectOffOrigin { .. }), "{err}");
}

#[test]
fn unknown_repos_unpinned_revisions_unsafe_paths_and_unlisted_files_are_refused() {
    let server = TestServer::start();
    let hub = server.hub();
    assert!(matches!(
        hub.tree("team/absent", PIN),
        Err(HubError::NotFound { .. })
    ));
    assert!(matches!(
        hub.tree(REPO, "main"),
        Err(HubError::NotPinned(_))
    ));
    server.behaviour.lock().unwrap().extra_entries = vec!["../outside".into()];
    assert!(matches!(
        hub.tree(REPO, PIN),
        Err(HubError::Tree(TreeError::UnsafePath(_)))
    ));
    server.behaviour.lock().unwrap().extra_entries = vec!["index.json".into()];
    assert!(matches!(
        hub.tree(REPO, PIN),
        Err(HubError::Tree(TreeError::Duplicate(_)))
    ));
}

#[test]
fn a_download_is_verified_parallel_and_resumes_after_a_dropped_connection() {
    let server = TestServer::start();
    let hub = server.hub();
    let tree = hub.tree(REPO, PIN).unwrap();
    assert_eq!(tree.files.len(), 5);
    let dest = tempfile::tempdir().unwrap();
    server
        .behaviour
        .lock()
        .unwrap()
        .drop_after
        .insert("layer00/layer00-w1.mxfp4tile".into(), 1_000_000);
    let progressed = std::sync::atomic::AtomicU64::new(0);
    let report = hub
        .download(&tree, dest.path(), &DownloadOptions::default(), &|n| {
            progressed.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        })
        .unwrap();
    assert_eq!(report.fetched.len(), 5);
    assert_eq!(progressed.into_inner(), tree.total_bytes());
    for (path, (content, _)) in generated_files() {
        assert_eq!(
            std::fs::read(dest.path().join(&path)).unwrap(),
            content,
            "{path}"
        );
    }
    assert!(!dest.path().join(".minirun-partial").exists());
    let ranges = server.behaviour.lock().unwrap().ranges.clone();
    assert!(
        ranges
            .iter()
            .any(|r| r.starts_with("layer00/layer00-w1.mxfp4tile bytes=")),
        "the dropped file resumed with a Range request: {ranges:?}"
    );
    assert_eq!(
        report.bytes_received,
        tree.total_bytes(),
        "no byte fetched twice"
    );

    // Everything in place: a second run fetches nothing.
    let again = hub
        .download(&tree, dest.path(), &DownloadOptions::default(), &|_| {})
        .unwrap();
    assert_eq!((again.fetched.len(), again.already_present.len()), (0, 5));
}

#[test]
fn a_partial_file_from_an_earlier_run_is_continued() {
    let server = TestServer::start();
    let hub = server.hub();
    let tree = hub.tree(REPO, PIN).unwrap();
    let dest = tempfile::tempdir().unwrap();
    let path = "layer01/layer01-w1.mxfp4tile";
    let content = generated_files()[path].0.clone();
    let partial = dest
        .path()
        .join(".minirun-partial")
        .join(format!("{path}.part"));
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    std::fs::write(&partial, &content[..400_000]).unwrap();
    let report = hub
        .download(&tree, dest.path(), &DownloadOptions::default(), &|_| {})
        .unwrap();
    assert_eq!(report.resumed, vec![path.to_string()]);
    assert_eq!(std::fs::read(dest.path().join(path)).unwrap(), content);
}

#[test]
fn a_link_planted_in_the_output_folder_is_not_written_through() {
    let server = TestServer::start();
    let hub = server.hub();
    let tree = hub.tree(REPO, PIN).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    for planted in ["layer01", ".minirun-partial"] {
        let dest = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dest.path().join(planted)).unwrap();
        let err = hub
            .download(&tree, dest.path(), &DownloadOptions::default(), &|_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("a symbolic link"), "{planted}: {err}");
        let written: Vec<_> = std::fs::read_dir(elsewhere.path()).unwrap().collect();
        assert!(
            written.is_empty(),
            "{planted}: wrote through the link: {written:?}"
        );
    }
}

#[test]
fn a_wrong_digest_or_commit_deletes_the_partial_file_and_places_nothing() {
    let server = TestServer::start();
    let hub = server.hub();
    let tree = hub.tree(REPO, PIN).unwrap();
    let path = "layer02/layer02-w1.mxfp4tile";
    let mut wrong = generated_files()[path].0.clone();
    wrong[1234] ^= 1;
    server
        .behaviour
        .lock()
        .unwrap()
        .wrong_content
        .insert(path.into(), wrong);
    let dest = tempfile::tempdir().unwrap();
    let options = DownloadOptions {
        parallel: 1,
        retries: 0,
    };
    let err = hub
        .download(&tree, dest.path(), &options, &|_| {})
        .unwrap_err();
    assert!(
        matches!(&err, HubError::WrongDigest { path: p, .. } if p == path),
        "{err}"
    );
    assert!(err.to_string().contains("partial file was deleted"));
    assert!(!dest.path().join(path).exists());
    assert!(
        !dest
            .path()
            .join(".minirun-partial")
            .join(format!("{path}.part"))
            .exists()
    );

    server.behaviour.lock().unwrap().wrong_content.clear();
    server.behaviour.lock().unwrap().commit = Some("f".repeat(40));
    let err = hub
        .download(&tree, dest.path(), &options, &|_| {})
        .unwrap_err();
    assert!(matches!(err, HubError::CommitMismatch { .. }), "{err}");
}

#[test]
fn the_catalog_keeps_the_accounts_minirun_artifacts_across_pages() {
    let server = TestServer::start();
    let catalog = server.hub().catalog("nanguoyu").unwrap();
    assert!(!catalog.is_empty());
    assert!(
        catalog
            .iter()
            .all(|e| e.repo.starts_with("nanguoyu/") && e.repo.ends_with("-minirun"))
    );
    let kimi = catalog
        .iter()
        .find(|e| e.name == "Kimi-K3")
        .expect("Kimi-K3 listed");
    assert_eq!(kimi.sha.len(), 40);
    let all: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(data().join("models-full.json")).unwrap())
            .unwrap();
    let expected = all
        .iter()
        .filter(|m| m["id"].as_str().unwrap().ends_with("-minirun"))
        .count();
    assert_eq!(catalog.len(), expected, "both pages read");
}
