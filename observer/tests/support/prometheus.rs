//! A node-pair monitoring stack for the cluster tests, all in one network
//! namespace of the test's own: one real node_exporter per lab node
//! (textfile collector on `<root>/<node>`), and a real Prometheus (the
//! Debian package) scraping them every second with deploy/'s rule file
//! loaded, on loopback only. Everything stops and is removed on drop,
//! also when a test panics.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{
    exporter::NodeExporter,
    netns::{Netns, WAIT, free_port, in_netns, terminate, wait_listening},
};

/// Debian's Prometheus server.
pub const PROMETHEUS: &str = "/usr/bin/prometheus";

/// The alerts the lab can fire within seconds: their `for:` becomes
/// [`FAST_FOR`] in the test's copy of the rule file, the rest stay as
/// deployed.
const FAST_ALERTS: [&str; 2] = ["ObserverOneWayPair", "ObserverPairLoss"];

/// Their wait in the tests: the lab's traffic lasts seconds, and when it
/// starts the sender's counter may be scraped a second or two before the
/// receiver's (what the deployed 10 minutes absorb).
const FAST_FOR: &str = "3s";

/// `rules` (deploy/prometheus-rules.yaml's text) with the `for:` of
/// [`FAST_ALERTS`] set to [`FAST_FOR`].
pub fn with_fast_alerts(rules: &str) -> String {
    let mut current = "";
    rules
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if let Some(name) = trimmed.strip_prefix("- alert: ") {
                current = name.trim();
            } else if trimmed.starts_with("- record: ") {
                current = "";
            }
            if trimmed.starts_with("for: ") && FAST_ALERTS.contains(&current) {
                let indent = &line[..line.len() - trimmed.len()];
                format!("{indent}for: {FAST_FOR}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

/// `text` as a URL query value: every byte but the unreserved ones
/// percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Writes a CA, a certificate it signs for 127.0.0.1 and a web config
/// with TLS and basic auth (`observer` / `s3cret`, bcrypt) into `dir`;
/// returns the web config's path.
fn secure(dir: &Path) -> PathBuf {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("running openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=observer test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ]);
    let hash = Command::new("python3")
        .args([
            "-c",
            "import crypt; print(crypt.crypt('s3cret', crypt.mksalt(crypt.METHOD_BLOWFISH)))",
        ])
        .output()
        .expect("hashing the password");
    let hash = String::from_utf8_lossy(&hash.stdout).trim().to_string();
    assert!(hash.starts_with("$2"), "no bcrypt hash: {hash:?}");
    let config = dir.join("web.yml");
    std::fs::write(
        &config,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  observer: '{hash}'\n",
            dir.join("server.pem").display(),
            dir.join("server.key").display()
        ),
    )
    .unwrap();
    config
}

/// The running stack.
pub struct Stack {
    // Dropped first: the processes go before their namespace.
    prometheus: Child,
    _exporters: Vec<NodeExporter>,
    netns: Netns,
    port: u16,
    dir: tempfile::TempDir,
    scheme: &'static str,
}

impl Stack {
    /// Starts a node_exporter per node in `nodes` and Prometheus.
    pub fn start(nodes: &[&str]) -> Stack {
        Stack::start_with(nodes, None, false)
    }

    /// Starts Prometheus (no exporter) on the blocks `promtool tsdb
    /// create-blocks-from openmetrics` makes of `openmetrics`.
    pub fn with_blocks(openmetrics: &str) -> Stack {
        Stack::start_with(&[], Some(openmetrics), false)
    }

    /// [`Stack::with_blocks`] behind TLS (a certificate for 127.0.0.1 from
    /// a CA of the test's, `ca.pem` in [`Stack::dir`]) and basic auth
    /// (user `observer`, password `s3cret`).
    pub fn secured_with_blocks(openmetrics: &str) -> Stack {
        Stack::start_with(&[], Some(openmetrics), true)
    }

    /// The stack's folder (certificates, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn start_with(nodes: &[&str], openmetrics: Option<&str>, secured: bool) -> Stack {
        let netns = Netns::new("obsprom");
        let dir = tempfile::Builder::new()
            .prefix("observer-cluster-")
            .tempdir()
            .unwrap();
        let web_config = secured.then(|| secure(dir.path()));
        if let Some(text) = openmetrics {
            let input = dir.path().join("series.om");
            std::fs::write(&input, text).unwrap();
            let out = Command::new(super::exporter::PROMTOOL)
                .args(["tsdb", "create-blocks-from", "openmetrics"])
                .arg(&input)
                .arg(dir.path().join("data"))
                .output()
                .expect("running promtool");
            assert!(
                out.status.success(),
                "promtool: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::remove_file(&input).unwrap();
        }
        let mut exporters = Vec::new();
        for node in nodes {
            let textfiles = dir.path().join("textfiles").join(node);
            std::fs::create_dir_all(&textfiles).unwrap();
            exporters.push(NodeExporter::start(&netns, &textfiles));
        }
        let rules = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus-rules.yaml"),
        )
        .unwrap();
        let rules_path = dir.path().join("rules.yaml");
        std::fs::write(&rules_path, with_fast_alerts(&rules)).unwrap();
        let targets: Vec<String> = exporters
            .iter()
            .map(|e| format!("'127.0.0.1:{}'", e.port()))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: [{}]\n",
            rules_path.display(),
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port(&netns);
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let prometheus = Command::new("ip")
            .args(["netns", "exec", netns.name(), PROMETHEUS])
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(web_config.map(|c| format!("--web.config.file={}", c.display())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning prometheus");
        let mut stack = Stack {
            prometheus,
            _exporters: exporters,
            netns,
            port,
            dir,
            scheme: if secured { "https" } else { "http" },
        };
        let deadline = Instant::now() + WAIT;
        // Behind TLS the plain readiness GET cannot work: a connection
        // accepted says as much.
        let ready = |stack: &Stack| {
            if secured {
                let addr = format!("127.0.0.1:{}", stack.port);
                in_netns(stack.netns.name(), move || TcpStream::connect(addr).is_ok())
            } else {
                stack
                    .get("/-/ready")
                    .is_some_and(|(status, _)| status == 200)
            }
        };
        while !ready(&stack) {
            if let Ok(Some(status)) = stack.prometheus.try_wait() {
                panic!("prometheus exited ({status}): {}", stack.log());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready: {}",
                stack.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        stack
    }

    /// Where the lab's observers write their textfiles (`observer lab
    /// --textfile-dir`).
    pub fn textfile_root(&self) -> PathBuf {
        self.dir.path().join("textfiles")
    }

    /// The namespace Prometheus listens in.
    pub fn netns_name(&self) -> &str {
        self.netns.name()
    }

    /// Prometheus's base URL (inside the stack's namespace).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    /// What Prometheus logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` over HTTP/1.0: status and body; `None` when nothing
    /// listens.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let addr = format!("127.0.0.1:{}", self.port);
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        let response = in_netns(self.netns.name(), move || {
            let mut stream = TcpStream::connect(&addr).ok()?;
            stream.set_read_timeout(Some(WAIT)).unwrap();
            stream.write_all(request.as_bytes()).ok()?;
            let mut response = String::new();
            stream.read_to_string(&mut response).ok()?;
            Some(response)
        })?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    }

    /// `/api/v1/query_range` of `promql` from `start` to `end` (Unix
    /// seconds), one point a second: the series that have any point.
    pub fn query_range(&self, promql: &str, start: f64, end: f64) -> Vec<Value> {
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            percent_encode(promql)
        );
        let (status, body) = self.get(&path).expect("prometheus answers");
        assert_eq!(status, 200, "{promql}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Prometheus' own metrics (`/metrics`).
    pub fn own_metrics(&self) -> String {
        let (status, body) = self.get("/metrics").expect("prometheus answers");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// The process id of Prometheus (its RSS for the bench).
    pub fn pid(&self) -> u32 {
        self.prometheus.id()
    }

    /// The alerts API's alerts (`/api/v1/alerts`).
    pub fn alerts(&self) -> Vec<Value> {
        let (status, body) = self.get("/api/v1/alerts").expect("prometheus answers");
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Firing alerts now, as (alertname, from, to, proto).
    pub fn firing(&self) -> Vec<(String, String, String, String)> {
        self.alerts()
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                let label = |k: &str| a["labels"][k].as_str().unwrap_or_default().to_string();
                (
                    label("alertname"),
                    label("from"),
                    label("to"),
                    label("proto"),
                )
            })
            .collect()
    }

    /// Runs `observer cluster --prometheus <url> ARGS` in the stack's
    /// namespace.
    pub fn cluster(&self, args: &[&str]) -> Output {
        self.cluster_at(&self.url(), args)
    }

    /// Runs `observer cluster --prometheus URL ARGS` in the stack's
    /// namespace (`url`: a proxy in front of Prometheus).
    pub fn cluster_at(&self, url: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                self.netns.name(),
                env!("CARGO_BIN_EXE_observer"),
            ])
            .args(["cluster", "--prometheus", url])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running observer cluster")
    }

    /// Starts nginx in the stack's namespace as a reverse proxy to
    /// Prometheus that answers 401 unless the request carries
    /// `Authorization: Bearer <token>`, as a gateway in front of Thanos or
    /// Mimir does.
    pub fn behind_bearer_proxy(&self, token: &str) -> BearerProxy {
        let dir = self.dir.path().join("nginx");
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port(&self.netns);
        let d = dir.display();
        let config = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{}}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  \
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      \
             if ($http_authorization != \"Bearer {token}\") {{ return 401; }}\n      \
             proxy_pass http://127.0.0.1:{};\n    }}\n  }}\n}}\n",
            self.port
        );
        let config_path = dir.join("nginx.conf");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", self.netns.name(), NGINX])
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning nginx (cargo xtask setup installs nginx-light)");
        let mut proxy = BearerProxy { child, port, dir };
        let log = proxy.dir.join("error.log");
        wait_listening(self.netns.name(), port, "nginx", &mut proxy.child, || {
            std::fs::read_to_string(&log).unwrap_or_default()
        });
        proxy
    }
}

/// Debian's nginx (nginx-light).
const NGINX: &str = "/usr/sbin/nginx";

/// nginx in front of a [`Stack`]'s Prometheus ([`Stack::behind_bearer_proxy`]);
/// stopped on drop.
pub struct BearerProxy {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl BearerProxy {
    /// The proxy's base URL (inside the stack's namespace).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What nginx logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }
}

impl Drop for BearerProxy {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(10));
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        terminate(&mut self.prometheus, Duration::from_secs(10));
    }
}
