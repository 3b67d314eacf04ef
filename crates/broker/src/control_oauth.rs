//! The control requests of `tools login SERVER` and `tools logout SERVER`
//! (issue 41). The daemon does the OAuth flow itself (it holds the servers
//! file and the secrets): `oauth-login` begins it and answers the URL the
//! operator opens; `oauth-login-wait` blocks until the browser's redirect
//! reached the daemon's loopback listener and the tokens are stored;
//! `oauth-logout` revokes and deletes them. No reply carries a token.

use serde_json::{Value, json};

use crate::broker::Broker;
use crate::control::{ok, refused};
use crate::upstream::config::{RemoteServer, ServerSource};
use crate::upstream_supervisor::oauth::OAuthError;
use crate::upstream_supervisor::oauth::login::{self, LoggedOut};

type Reply = Result<Value, Value>;

fn remote<'a>(broker: &'a Broker, server: &str) -> Result<&'a RemoteServer, Value> {
    let slot = broker
        .upstreams()
        .slots
        .iter()
        .find(|s| s.config.name == server)
        .ok_or_else(|| refused("unknown_server", format!("no upstream server `{server}`")))?;
    match &slot.config.source {
        ServerSource::Remote(remote) if remote.oauth.is_some() => Ok(remote),
        _ => Err(refused(
            "no_oauth",
            format!("`{server}` is not a remote server with an `oauth` entry"),
        )),
    }
}

/// Runs the daemon's async step from the control thread (a blocking one).
fn block_on<F: Future>(future: F) -> Result<F::Output, Value> {
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| refused("internal", format!("no runtime: {e}")))?;
    Ok(runtime.block_on(future))
}

pub fn login(broker: &Broker, server: &str) -> Reply {
    let remote = remote(broker, server)?;
    let url = block_on(login::begin(remote, server, broker.state_dir()))?
        .map_err(|e| refused("oauth", e.to_string()))?;
    Ok(ok(json!({"server": server, "url": url,
                 "timeout_s": login::LOGIN_TIMEOUT.as_secs()})))
}

pub fn login_wait(broker: &Broker, server: &str) -> Reply {
    remote(broker, server)?;
    block_on(login::wait(server))?.map_err(|e| refused("oauth", e))?;
    let file = crate::upstream_supervisor::oauth::store::FileStore::new(
        &crate::upstream_supervisor::oauth::store::token_dir(broker.state_dir()),
        server,
    );
    Ok(ok(
        json!({"server": server, "stored": file.path().display().to_string()}),
    ))
}

pub fn logout(broker: &Broker, server: &str) -> Reply {
    let remote = remote(broker, server)?;
    let outcome = block_on(login::logout(remote, server, broker.state_dir()))?
        .map_err(|e| refused("oauth", e.to_string()))?;
    // The session made with those tokens ends now: the server is down until
    // the next login (calls to its tools say so), not up and refusing.
    let needs_login = OAuthError::LoginNeeded(server.to_string()).to_string();
    broker.upstreams().end_session(server, &needs_login);
    let outcome = match outcome {
        LoggedOut::Revoked => "revoked",
        LoggedOut::Deleted => "deleted",
        LoggedOut::NothingStored => "nothing_stored",
    };
    Ok(ok(json!({"server": server, "outcome": outcome})))
}
