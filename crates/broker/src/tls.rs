//! Relays on other hosts: the daemon's certificate authority, a client
//! certificate per agent, and a TCP listener that takes only those
//! (mutual TLS). An agent's identity comes from its certificate as it
//! comes from its socket on one host: the daemon records the SHA-256 of
//! every certificate it issues against the agent (`agent_certs`), and a
//! connection speaks for the agent whose recorded certificate it shows;
//! removing the agent, or `agent cert --replace`, revokes it.
//!
//! ```text
//! STATE_DIR/tls/ca.key      0600, the authority's key (never leaves the host)
//! STATE_DIR/tls/ca.crt      the authority's certificate (the relays' trust root)
//! STATE_DIR/tls/listening   the address the listener is bound to
//! ```
//!
//! rcgen makes the certificates (the rustls project's; ECDSA P-256 with
//! ring, the TLS stack the gateway already uses) and rustls serves them.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

/// How long an agent's certificate is valid (replace it with `agent cert
/// --replace`; removing the agent revokes it at once).
const AGENT_CERT_DAYS: u64 = 90;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("{0}")]
    Invalid(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TlsError {
    let what = what.into();
    move |e| TlsError::Io(what, e)
}

/// An agent's certificate and key, and the authority's certificate the
/// relay trusts the daemon by (all PEM).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct AgentCredentials {
    pub cert: String,
    pub key: String,
    pub ca: String,
    /// The SHA-256 of the certificate (DER), hex: what the daemon records.
    pub fingerprint: String,
}

impl std::fmt::Debug for AgentCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("AgentCredentials")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// TLS 1.3 only: both ends are ours, and 1.2 would send the client's
/// certificate (the agent's id) in the clear.
pub const PROTOCOLS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The daemon's certificate authority, in `STATE_DIR/tls`.
pub struct Authority {
    dir: PathBuf,
    key: KeyPair,
    ca_pem: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").field("dir", &self.dir).finish()
    }
}

/// The authority's parameters: also what issuing needs (its name and key
/// identifier method), so the key alone rebuilds the issuer.
fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "substrat-sandbox daemon CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2045, 1, 1);
    Ok(params)
}

/// Writes `text` to `path` with `mode`, replacing it whole (a temporary
/// file renamed over it: a crash leaves the old file or the new one).
fn write_private(path: &Path, text: &str, mode: u32) -> Result<(), TlsError> {
    let temporary = path.with_extension("new");
    let _ = fs::remove_file(&temporary);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .map_err(io(format!("create {}", temporary.display())))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io(format!("write {}", temporary.display())))?;
    fs::rename(&temporary, path).map_err(io(format!("rename to {}", path.display())))
}

/// The SHA-256 of a certificate's DER, hex.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Authority {
    /// The authority in `state_dir/tls`, made on first use.
    pub fn open_or_create(state_dir: &Path) -> Result<Self, TlsError> {
        let dir = state_dir.join("tls");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(format!("create {}", dir.display())))?;
        let (key_path, ca_path) = (dir.join("ca.key"), dir.join("ca.crt"));
        if key_path.exists() {
            let key_pem = fs::read_to_string(&key_path)
                .map_err(io(format!("read {}", key_path.display())))?;
            let ca_pem =
                fs::read_to_string(&ca_path).map_err(io(format!("read {}", ca_path.display())))?;
            let key = KeyPair::from_pem(&key_pem)?;
            return Ok(Self { dir, key, ca_pem });
        }
        let key = KeyPair::generate()?;
        let ca_pem = ca_params()?.self_signed(&key)?.pem();
        // The certificate first: the key's presence says the pair is whole.
        write_private(&ca_path, &ca_pem, 0o644)?;
        write_private(&key_path, &key.serialize_pem(), 0o600)?;
        Ok(Self { dir, key, ca_pem })
    }

    /// A client certificate for `agent_id`: its id as the common name and
    /// as a URI (`urn:substrat:agent:ID`), for client authentication only.
    pub fn issue_agent(&self, agent_id: &str) -> Result<AgentCredentials, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, agent_id);
        params.distinguished_name = name;
        let uri = format!("urn:substrat:agent:{agent_id}");
        params.subject_alt_names =
            vec![SanType::URI(uri.try_into().map_err(|_| {
                TlsError::Invalid(format!("agent id `{agent_id}` in a URI"))
            })?)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        valid_for(&mut params, AGENT_CERT_DAYS);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer()?)?;
        self.verifies(cert.der())?;
        Ok(AgentCredentials {
            fingerprint: fingerprint(cert.der()),
            cert: cert.pem(),
            key: key.serialize_pem(),
            ca: self.ca_pem.clone(),
        })
    }

    fn issuer(&self) -> Result<Issuer<'static, &KeyPair>, TlsError> {
        Ok(Issuer::new(ca_params()?, &self.key))
    }

    /// The listener's configuration: a certificate for `names` (DNS names
    /// or IP addresses the relays connect to), and client certificates
    /// required, verified against this authority only.
    pub fn server_config(&self, names: &[String]) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        // Issued at each start, valid for a year, its key only in memory:
        // a copy of the state directory holds nothing to pose as the
        // daemon with.
        let mut params = CertificateParams::new(names.to_vec())?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "substrat-sandbox daemon");
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        valid_for(&mut params, 365);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer()?)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = self.client_verifier(provider.clone())?;
        let key =
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).map_err(pem_error)?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(PROTOCOLS)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![cert.der().clone()], key)?;
        Ok(Arc::new(config))
    }

    /// Client certificates of this authority, by `ca.crt`.
    fn client_verifier(
        &self,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).map_err(pem_error)?)?;
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| TlsError::Invalid(format!("client verifier: {e}")))
    }

    /// Whether a certificate just issued verifies against `ca.crt`: a
    /// `ca.crt` that is not `ca.key`'s fails here, not at every relay.
    fn verifies(&self, der: &CertificateDer<'static>) -> Result<(), TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let now = rustls::pki_types::UnixTime::now();
        self.client_verifier(provider)?
            .verify_client_cert(der, &[], now)
            .map(|_| ())
            .map_err(|e| {
                TlsError::Invalid(format!(
                    "{}/ca.crt does not verify what ca.key signs ({e}): the authority is damaged",
                    self.dir.display()
                ))
            })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Valid from an hour ago (clocks drift) for `days`.
fn valid_for(params: &mut CertificateParams, days: u64) {
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + std::time::Duration::from_millis(crate::store::now_ms().max(0) as u64);
    params.not_before = now - std::time::Duration::from_secs(3600);
    params.not_after = now + std::time::Duration::from_secs(days * 86_400);
}

fn pem_error(e: rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Invalid(format!("PEM: {e}"))
}
