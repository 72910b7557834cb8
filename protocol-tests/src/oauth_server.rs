//! A real OAuth 2.0 token endpoint for the OIDC client-credentials tests:
//! `oauth2-mock-server` (npm, pinned and installed into `<workspace>/.peers/node` by
//! `scripts/install-peers.sh`), started by `peers/oauth_server.mjs`, which checks the
//! client's HTTP Basic credentials (401 `invalid_client` otherwise), signs RS256 JWTs
//! whose `sub` is the client id and whose `exp` and `expires_in` are the lifetime
//! asked for, and prints a line per token request and the public keys it signs with.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The running token endpoint; the node process is killed when this is dropped.
#[derive(Debug)]
pub struct OAuthServer {
    child: Child,
    port: u16,
    https: bool,
    lines: Arc<Mutex<Vec<String>>>,
}

impl OAuthServer {
    /// Starts the endpoint for one client, with tokens that live `ttl`, over http.
    pub fn start(client_id: &str, client_secret: &str, ttl: Duration) -> anyhow::Result<Self> {
        Self::start_with(client_id, client_secret, ttl, None)
    }

    /// The same over https, with this certificate and key (PEM files).
    pub fn start_https(
        client_id: &str,
        client_secret: &str,
        ttl: Duration,
        cert: &Path,
        key: &Path,
    ) -> anyhow::Result<Self> {
        Self::start_with(client_id, client_secret, ttl, Some((cert, key)))
    }

    fn start_with(
        client_id: &str,
        client_secret: &str,
        ttl: Duration,
        tls: Option<(&Path, &Path)>,
    ) -> anyhow::Result<Self> {
        let root = workspace_root();
        let module = root.join(".peers/node/node_modules/oauth2-mock-server/dist/index.js");
        anyhow::ensure!(
            module.exists(),
            "{} is missing: run scripts/install-peers.sh (it installs oauth2-mock-server with npm)",
            module.display()
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/oauth_server.mjs");
        let mut command = Command::new("node");
        command
            .arg(script)
            .arg(&module)
            .arg(client_id)
            .arg(client_secret)
            .arg(ttl.as_secs().to_string());
        if let Some((cert, key)) = tls {
            command.arg(key).arg(cert);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| anyhow::anyhow!("node: {e} (Node 20.19 or later is needed)"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut server = Self {
            child,
            port: 0,
            https: tls.is_some(),
            lines,
        };
        while Instant::now() < deadline {
            let port = server
                .lines()
                .iter()
                .find_map(|l| l.strip_prefix("listening ")?.trim().parse().ok());
            if let Some(port) = port {
                server.port = port;
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                anyhow::bail!("the OAuth server exited with {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        anyhow::bail!("the OAuth server did not start within 20 s")
    }

    /// The token endpoint's URL (`https://localhost:PORT/token` over https: the test
    /// PKI's server certificate names `localhost` and `127.0.0.1`).
    pub fn token_url(&self) -> String {
        match self.https {
            true => format!("https://localhost:{}/token", self.port),
            false => format!("http://127.0.0.1:{}/token", self.port),
        }
    }

    /// The URL of its signing keys (a JWKS document).
    pub fn jwks_url(&self) -> String {
        format!("http://127.0.0.1:{}/jwks", self.port)
    }

    /// The RSA public keys it signs tokens with, as (modulus, exponent) big-endian
    /// bytes, for [`ResponderOptions::oauth_rsa_keys`](crate::sasl_responder::ResponderOptions).
    pub fn rsa_keys(&self) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let lines = self.lines();
        let json = lines
            .iter()
            .find_map(|l| l.strip_prefix("jwks "))
            .ok_or_else(|| anyhow::anyhow!("no jwks line"))?;
        let jwks: serde_json::Value = serde_json::from_str(json)?;
        let mut keys = Vec::new();
        // `keys.toJSON()` is the JWKS's `keys` array itself.
        let list = jwks.get("keys").unwrap_or(&jwks);
        for key in list.as_array().into_iter().flatten() {
            let (Some(n), Some(e)) = (key["n"].as_str(), key["e"].as_str()) else {
                continue;
            };
            keys.push((b64.decode(n)?, b64.decode(e)?));
        }
        anyhow::ensure!(!keys.is_empty(), "no RSA key in {json}");
        Ok(keys)
    }

    /// Every line it printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The token requests it answered with a token.
    pub fn tokens_issued(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.starts_with("token "))
            .collect()
    }

    /// The signatures (third part) of the tokens it issued.
    pub fn signatures(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter_map(|l| l.strip_prefix("issued ").map(str::to_string))
            .collect()
    }

    /// The token requests it refused.
    pub fn refusals(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.starts_with("refused "))
            .collect()
    }
}

impl Drop for OAuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}
