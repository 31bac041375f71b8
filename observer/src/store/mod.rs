//! The one place that talks to a metrics store: the Prometheus HTTP API
//! (`/api/v1/query`), which Prometheus, Thanos Query, Mimir and
//! VictoriaMetrics all serve. Instant queries only, blocking, with basic
//! auth or a bearer token read from files and TLS verified against the
//! system's roots or a CA file.

use std::{fs, io::BufReader, path::Path, time::Duration};

use base64::Engine;
use observer_core::{
    model::cluster::Series,
    parse::prometheus::{self, AnswerError},
};
use ureq::{
    Agent,
    tls::{Certificate, PemItem, RootCerts, TlsConfig},
};

/// Why a query has no answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL is not http(s)://HOST[:PORT][/PATH].
    #[error("--prometheus {0}: not an http:// or https:// URL")]
    BadUrl(String),
    /// A credentials or CA file could not be read.
    #[error("{what} {path}: {source}")]
    File {
        /// Which option.
        what: &'static str,
        /// Its path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The CA file holds no certificate.
    #[error("--ca-file {0}: no PEM certificate in it")]
    NoCertificate(String),
    /// The store did not answer (refused, DNS, TLS, timeout).
    #[error("cannot reach {url}: {source}; is Prometheus running there (`curl {url}/-/ready`)?")]
    Unreachable {
        /// The base URL.
        url: String,
        /// What failed.
        source: Box<ureq::Error>,
    },
    /// The store answered with an HTTP error.
    #[error("{url} answered HTTP {status}{hint}: {body}")]
    Http {
        /// The base URL.
        url: String,
        /// The status code.
        status: u16,
        /// What to check for that status.
        hint: &'static str,
        /// The start of the body.
        body: String,
    },
    /// The answer is no instant vector.
    #[error("{url}: {source}")]
    Answer {
        /// The base URL.
        url: String,
        /// Why.
        source: AnswerError,
    },
}

/// How to reach the store.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Base URL (`http://prometheus:9090`, or a path prefix such as
    /// Mimir's `http://mimir/prometheus`).
    pub url: String,
    /// File with `USER:PASSWORD` for basic auth.
    pub basic_auth_file: Option<std::path::PathBuf>,
    /// File with a bearer token.
    pub bearer_token_file: Option<std::path::PathBuf>,
    /// PEM file of the CA(s) to trust instead of the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Time limit of one query.
    pub timeout: Duration,
}

/// A Prometheus-compatible query endpoint.
pub struct Store {
    url: String,
    agent: Agent,
    authorization: Option<String>,
}

fn read(what: &'static str, path: &Path) -> Result<String, StoreError> {
    fs::read_to_string(path).map_err(|source| StoreError::File {
        what,
        path: path.display().to_string(),
        source,
    })
}

impl Store {
    /// Checks the options and reads the credential and CA files.
    pub fn new(options: &Options) -> Result<Store, StoreError> {
        let url = options.url.trim_end_matches('/').to_string();
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        if host.is_none_or(|h| h.is_empty() || h.starts_with('/')) {
            return Err(StoreError::BadUrl(options.url.clone()));
        }
        let authorization = match (&options.basic_auth_file, &options.bearer_token_file) {
            (Some(path), _) => {
                let user_password = read("--basic-auth-file", path)?;
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(user_password.trim_end())
                ))
            }
            (None, Some(path)) => Some(format!(
                "Bearer {}",
                read("--bearer-token-file", path)?.trim()
            )),
            (None, None) => None,
        };
        let mut tls = TlsConfig::builder();
        if let Some(path) = &options.ca_file {
            let pem = read("--ca-file", path)?;
            let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(pem.as_bytes())
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(StoreError::NoCertificate(path.display().to_string()));
            }
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        }
        let agent = Agent::config_builder()
            .timeout_global(Some(options.timeout))
            .http_status_as_error(false)
            .tls_config(tls.build())
            .build()
            .new_agent();
        Ok(Store {
            url,
            agent,
            authorization,
        })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Evaluates `promql` at `at` (Unix seconds) as an instant query and
    /// hands each series of the answer to `each` as it is read.
    pub fn query(&self, promql: &str, at: f64, each: impl FnMut(Series)) -> Result<(), StoreError> {
        let mut request = self
            .agent
            .post(format!("{}/api/v1/query", self.url))
            .header("Accept", "application/json");
        if let Some(auth) = &self.authorization {
            request = request.header("Authorization", auth);
        }
        let time = format!("{at:.3}");
        let unreachable = |e| StoreError::Unreachable {
            url: self.url.clone(),
            source: Box::new(e),
        };
        let mut response = request
            .send_form([("query", promql), ("time", time.as_str())])
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        let answer = |source| StoreError::Answer {
            url: self.url.clone(),
            source,
        };
        if status == 200 {
            // serde_json reads a reader byte by byte: buffer it.
            let body =
                BufReader::with_capacity(1 << 16, response.body_mut().with_config().reader());
            return prometheus::instant_vector(body, each).map_err(answer);
        }
        let body = response
            .body_mut()
            .with_config()
            .limit(1 << 20)
            .read_to_vec()
            .map_err(unreachable)?;
        // The API answers 400/422/503 with its JSON error: its words are
        // better than the status.
        match prometheus::instant_vector(body.as_slice(), |_| ()) {
            Err(source @ AnswerError::Refused { .. }) => Err(answer(source)),
            _ => Err(StoreError::Http {
                url: self.url.clone(),
                status,
                hint: match status {
                    401 | 403 => " (check --basic-auth-file / --bearer-token-file)",
                    404 => " (no /api/v1/query there: give the URL Prometheus' API is under)",
                    _ => "",
                },
                body: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(url: &str) -> Options {
        Options {
            url: url.to_string(),
            timeout: Duration::from_secs(1),
            ..Options::default()
        }
    }

    #[test]
    fn credentials_come_from_files_as_headers() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "abc.def\n").unwrap();
        let store = Store::new(&Options {
            bearer_token_file: Some(token),
            ..options("https://thanos.example/")
        })
        .unwrap();
        assert_eq!(store.authorization.as_deref(), Some("Bearer abc.def"));
        assert_eq!(store.url(), "https://thanos.example");
        let basic = dir.path().join("basic");
        std::fs::write(&basic, "observer:s3cret\n").unwrap();
        let store = Store::new(&Options {
            basic_auth_file: Some(basic),
            ..options("http://prometheus:9090")
        })
        .unwrap();
        // base64("observer:s3cret")
        assert_eq!(
            store.authorization.as_deref(),
            Some("Basic b2JzZXJ2ZXI6czNjcmV0")
        );
    }

    #[test]
    fn bad_urls_and_missing_files_are_named() {
        assert!(matches!(
            Store::new(&options("prometheus:9090")),
            Err(StoreError::BadUrl(_))
        ));
        let e = Store::new(&Options {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..options("https://p")
        })
        .err()
        .unwrap();
        assert!(
            e.to_string().starts_with("--ca-file /nonexistent/ca.pem: "),
            "{e}"
        );
    }
}
