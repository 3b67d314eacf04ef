//! `tools login SERVER` and `tools logout SERVER`, carried out by the
//! daemon (it holds the servers file and the secrets). Login: the
//! daemon binds 127.0.0.1 on a port of the kernel's choosing, begins the
//! code flow with http://127.0.0.1:PORT/callback as the redirect URI and
//! answers the authorization URL; the operator's browser brings the code
//! back to that listener; rmcp exchanges it and the tokens land in the
//! token file. Logout: each stored token revoked where the authorization
//! server has a revocation endpoint (RFC 7009), then the file deleted.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use oauth2::TokenResponse;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::flow::{self, OAuthError, Variables};
use super::store::{FileStore, token_dir};
use crate::upstream::config::RemoteServer;
use crate::upstream::oauth::{OAuthConfig, OAuthGrant};

/// The redirect URI's path on the loopback listener.
pub const CALLBACK_PATH: &str = "/callback";
/// How long a login waits for the browser.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The most of a request the listener reads (its head).
const MAX_HEAD: usize = 16 * 1024;
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

pub fn loopback_redirect_uri(port: u16) -> String {
    format!("http://127.0.0.1:{port}{CALLBACK_PATH}")
}

type Outcome = oneshot::Receiver<Result<(), String>>;

/// Logins begun and not yet waited for, by server.
fn pending() -> &'static Mutex<HashMap<String, Outcome>> {
    static PENDING: OnceLock<Mutex<HashMap<String, Outcome>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

fn oauth_of<'a>(remote: &'a RemoteServer, server: &str) -> Result<&'a OAuthConfig, OAuthError> {
    let config = remote
        .oauth
        .as_ref()
        .ok_or_else(|| OAuthError::Other(format!("`{server}` has no `oauth` entry")))?;
    if config.grant != OAuthGrant::AuthorizationCode {
        return Err(OAuthError::Other(format!(
            "`{server}` uses grant client_credentials: the daemon needs no login"
        )));
    }
    Ok(config)
}

/// Begins a login: the URL to open. The flow's end is awaited by `wait`.
pub async fn begin(
    remote: &RemoteServer,
    server: &str,
    state_dir: &Path,
) -> Result<String, OAuthError> {
    let config = oauth_of(remote, server)?;
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| OAuthError::Other(format!("cannot listen on 127.0.0.1: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| OAuthError::Other(e.to_string()))?
        .port();
    let redirect_uri = loopback_redirect_uri(port);
    let store = FileStore::new(&token_dir(state_dir), server);
    let manager = flow::manager(&remote.url, Some(store)).await?;
    let challenge = probe_challenge(&remote.url).await;
    let session = flow::begin_code(
        manager,
        config,
        &Variables::default(),
        challenge.as_deref(),
        &redirect_uri,
    )
    .await
    .map_err(|(_, e)| e)?;
    let url = session.auth_url.clone();
    let (done, outcome) = oneshot::channel();
    if let Ok(mut map) = pending().lock() {
        map.insert(server.to_string(), outcome);
    }
    tokio::spawn(async move {
        let result = match tokio::time::timeout(LOGIN_TIMEOUT, receive(&listener, port)).await {
            Ok(Ok(callback)) => flow::finish_code(session, &callback)
                .await
                .map(drop)
                .map_err(|(_, e)| e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no answer from the browser within {} s",
                LOGIN_TIMEOUT.as_secs()
            )),
        };
        let _ = done.send(result);
    });
    Ok(url)
}

/// Waits for the login `begin` started; its error, if any.
pub async fn wait(server: &str) -> Result<(), String> {
    let outcome = pending().lock().ok().and_then(|mut map| map.remove(server));
    match outcome {
        Some(outcome) => outcome
            .await
            .unwrap_or_else(|_| Err("the login ended unfinished".into())),
        None => Err(format!("no login of `{server}` is under way")),
    }
}

/// The challenge of an unauthenticated request (a 401's
/// `WWW-Authenticate`): its `resource_metadata` and `scope` guide discovery.
async fn probe_challenge(url: &str) -> Option<String> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(HTTP_TIMEOUT)
        .build()
        .ok()?;
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "substrat-sandbox", "version": env!("CARGO_PKG_VERSION")}}});
    let response = client
        .post(url)
        .header(
            reqwest::header::ACCEPT,
            "application/json, text/event-stream",
        )
        .json(&initialize)
        .send()
        .await
        .ok()?;
    if response.status() != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    let header = response.headers().get(reqwest::header::WWW_AUTHENTICATE)?;
    header.to_str().ok().map(String::from)
}

/// Serves the loopback until a request for the callback path arrives: the
/// callback URL it carried. Anything else gets a 404.
async fn receive(listener: &TcpListener, port: u16) -> Result<String, OAuthError> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|e| OAuthError::Other(format!("the loopback listener: {e}")))?;
        let mut head = Vec::new();
        let mut buf = [0u8; 2048];
        while head.len() < MAX_HEAD && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match tokio::time::timeout(HTTP_TIMEOUT, stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let Some(target) = callback_target(&head) else {
            let _ = stream.write_all(&answer(404, "Not the callback.")).await;
            continue;
        };
        let _ = stream
            .write_all(&answer(
                200,
                "substrat-sandbox: received; you can close this window.",
            ))
            .await;
        let _ = stream.shutdown().await;
        return Ok(format!("http://127.0.0.1:{port}{target}"));
    }
}

/// The target of a `GET /callback?...` request line, or none.
pub fn callback_target(head: &[u8]) -> Option<&str> {
    let line_end = head.iter().position(|&b| b == b'\r' || b == b'\n')?;
    let line = std::str::from_utf8(head.get(..line_end)?).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if method != "GET" || !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return None;
    }
    let path = target.split('?').next()?;
    (path == CALLBACK_PATH && target.bytes().all(|b| b.is_ascii_graphic())).then_some(target)
}

fn answer(status: u16, text: &str) -> Vec<u8> {
    let reason = if status == 200 { "OK" } else { "Not Found" };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n{text}",
        text.len()
    )
    .into_bytes()
}

/// What logout did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoggedOut {
    /// Tokens revoked at the authorization server and the file deleted.
    Revoked,
    /// The file deleted; no revocation endpoint (or it refused).
    Deleted,
    /// There were no tokens.
    NothingStored,
}

/// Revokes (RFC 7009) and deletes the stored tokens of `server`.
pub async fn logout(
    remote: &RemoteServer,
    server: &str,
    state_dir: &Path,
) -> Result<LoggedOut, OAuthError> {
    let config = oauth_of(remote, server)?;
    let store = FileStore::new(&token_dir(state_dir), server);
    let Some(stored) = store.read()? else {
        return Ok(LoggedOut::NothingStored);
    };
    let mut revoked = false;
    if let Some(tokens) = &stored.token_response {
        let manager = flow::manager(&remote.url, None).await?;
        let endpoint = manager.resolve_metadata().await.ok().and_then(|r| {
            let value = r.metadata.additional_fields.get("revocation_endpoint")?;
            value.as_str().map(String::from)
        });
        if let Some(endpoint) = endpoint {
            let mut all = true;
            if let Some(refresh) = tokens.refresh_token() {
                all &= revoke(
                    &endpoint,
                    config,
                    &stored.client_id,
                    refresh.secret(),
                    "refresh_token",
                )
                .await;
            }
            let access = tokens.access_token().secret();
            all &= revoke(&endpoint, config, &stored.client_id, access, "access_token").await;
            revoked = all;
        }
    }
    store.delete()?;
    Ok(if revoked {
        LoggedOut::Revoked
    } else {
        LoggedOut::Deleted
    })
}

/// One RFC 7009 request; whether the server took it (200).
async fn revoke(
    endpoint: &str,
    config: &OAuthConfig,
    client_id: &str,
    token: &str,
    hint: &str,
) -> bool {
    let Ok(client) = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(HTTP_TIMEOUT)
        .build()
    else {
        return false;
    };
    let secret = config
        .client_secret_env
        .as_deref()
        .and_then(|var| Variables::default().get(var).ok());
    let mut form = vec![("token", token), ("token_type_hint", hint)];
    let mut request = client.post(endpoint);
    match &secret {
        Some(secret) => request = request.basic_auth(client_id, Some(secret)),
        None => form.push(("client_id", client_id)),
    }
    let body = form
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}={}",
                percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC)
            )
        })
        .collect::<Vec<_>>()
        .join("&");
    request
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(body)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_callback_is_taken() {
        let ok = b"GET /callback?code=a&state=b HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(callback_target(ok), Some("/callback?code=a&state=b"));
        for bad in [
            &b"POST /callback?code=a HTTP/1.1\r\n\r\n"[..],
            b"GET /favicon.ico HTTP/1.1\r\n\r\n",
            b"GET /callbackx?code=a HTTP/1.1\r\n\r\n",
            b"GET /callback?code=a HTTP/1.1 extra\r\n\r\n",
            b"GET /callback?code=\xff HTTP/1.1\r\n\r\n",
            b"GET /callback",
            b"",
        ] {
            assert_eq!(
                callback_target(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
