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

/// The certificate authorities a daemon trusts, and the one it issues
/// with: its own in `STATE_DIR/tls`, or the team's (crate::team_ca).
pub struct Authority {
    dir: PathBuf,
    /// Oldest first; the last one issues.
    cas: Vec<Ca>,
    /// The one that signs the listener's certificate (see `server_config`).
    serving: usize,
}

/// One authority: its key and certificate.
pub struct Ca {
    key: KeyPair,
    pem: String,
    fingerprint: String,
}

impl Ca {
    /// An authority from its key and certificate (PEM), checked to be a
    /// pair: a certificate it signs verifies against the certificate.
    pub fn new(key_pem: &str, pem: String) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem)?;
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(pem_error)?;
        let ca = Self {
            key,
            fingerprint: fingerprint(der.as_ref()),
            pem,
        };
        let probe = ca.sign_agent("probe")?;
        ca.verifies(&probe).map_err(|e| {
            TlsError::Invalid(format!(
                "authority {}: its key and certificate are not a pair ({e})",
                ca.fingerprint
            ))
        })?;
        Ok(ca)
    }

    /// A new authority (ECDSA P-256).
    pub fn generate() -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let cert = ca_params()?.self_signed(&key)?;
        Ok(Self {
            fingerprint: fingerprint(cert.der()),
            pem: cert.pem(),
            key,
        })
    }

    /// The SHA-256 of its certificate (DER), hex.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Its certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    /// Its key, PEM (to seal; never written anywhere in the clear here).
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    fn issuer(&self) -> Result<Issuer<'static, &KeyPair>, TlsError> {
        Ok(Issuer::new(ca_params()?, &self.key))
    }

    /// A client certificate for `agent_id` and its key.
    fn sign_agent(&self, agent_id: &str) -> Result<CertificateDer<'static>, TlsError> {
        Ok(self.sign_agent_with_key(agent_id)?.0.der().clone())
    }

    fn sign_agent_with_key(
        &self,
        agent_id: &str,
    ) -> Result<(rcgen::Certificate, KeyPair), TlsError> {
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
        Ok((cert, key))
    }

    /// Whether `der` verifies against this authority alone.
    fn verifies(&self, der: &CertificateDer<'static>) -> Result<(), TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let now = rustls::pki_types::UnixTime::now();
        client_verifier(std::slice::from_ref(self), provider)?
            .verify_client_cert(der, &[], now)
            .map(|_| ())
            .map_err(|e| TlsError::Invalid(e.to_string()))
    }
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Ca")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cas: Vec<&str> = self.cas.iter().map(|c| c.fingerprint.as_str()).collect();
        f.debug_struct("Authority")
            .field("dir", &self.dir)
            .field("cas", &cas)
            .finish()
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

/// The agent a certificate names (its one URI SAN,
/// `urn:substrat:agent:ID`), if it names exactly one: a recorded
/// certificate speaks only for the agent it names, so a database row
/// moved to another agent binds nothing.
pub fn agent_named(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let mut named = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => uri.strip_prefix("urn:substrat:agent:"),
            _ => None,
        });
    let agent = named.next()?;
    named.next().is_none().then(|| agent.to_string())
}

/// The SHA-256 of a certificate's DER, hex.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `text` is exactly a fingerprint as [`fingerprint`] writes it:
/// 64 lowercase hex digits, nothing around them.
pub fn is_fingerprint(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Client certificates of `cas`.
fn client_verifier(
    cas: &[Ca],
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).map_err(pem_error)?)?;
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::Invalid(format!("client verifier: {e}")))
}

/// The daemon's own authority in `state_dir/tls`, if it has one (never
/// made here).
pub fn file_authority(state_dir: &Path) -> Result<Option<Ca>, TlsError> {
    let dir = state_dir.join("tls");
    let (key_path, ca_path) = (dir.join("ca.key"), dir.join("ca.crt"));
    if !key_path.exists() {
        return Ok(None);
    }
    let key_pem =
        fs::read_to_string(&key_path).map_err(io(format!("read {}", key_path.display())))?;
    let ca_pem = fs::read_to_string(&ca_path).map_err(io(format!("read {}", ca_path.display())))?;
    Ca::new(&key_pem, ca_pem)
        .map(Some)
        .map_err(|e| TlsError::Invalid(format!("{}: {e}", dir.display())))
}

fn tls_dir(state_dir: &Path) -> Result<PathBuf, TlsError> {
    let dir = state_dir.join("tls");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io(format!("create {}", dir.display())))?;
    Ok(dir)
}

impl Authority {
    /// The authority in `state_dir/tls`, made on first use.
    pub fn open_or_create(state_dir: &Path) -> Result<Self, TlsError> {
        let dir = tls_dir(state_dir)?;
        if let Some(ca) = file_authority(state_dir)? {
            return Ok(Self {
                dir,
                cas: vec![ca],
                serving: 0,
            });
        }
        let ca = Ca::generate()?;
        // The certificate first: the key's presence says the pair is whole.
        write_private(&dir.join("ca.crt"), &ca.pem, 0o644)?;
        write_private(&dir.join("ca.key"), &ca.key_pem(), 0o600)?;
        Ok(Self {
            dir,
            cas: vec![ca],
            serving: 0,
        })
    }

    /// The team's authorities (oldest first, the last issues); the
    /// listener's certificate is signed by `serving`'s.
    pub fn team(state_dir: &Path, cas: Vec<Ca>, serving: usize) -> Result<Self, TlsError> {
        if cas.is_empty() || serving >= cas.len() {
            return Err(TlsError::Invalid("no authority to issue with".into()));
        }
        Ok(Self {
            dir: tls_dir(state_dir)?,
            cas,
            serving,
        })
    }

    fn issuing(&self) -> &Ca {
        // Never empty: both constructors put one in.
        &self.cas[self.cas.len() - 1]
    }

    /// The SHA-256 of the issuing authority's certificate.
    pub fn issuing_fingerprint(&self) -> &str {
        &self.issuing().fingerprint
    }

    /// The fingerprints of every authority trusted, oldest first.
    pub fn fingerprints(&self) -> Vec<String> {
        self.cas.iter().map(|c| c.fingerprint.clone()).collect()
    }

    /// The certificates a relay trusts the daemons by: every authority
    /// trusted now (both during a rotation's overlap), PEM.
    pub fn bundle(&self) -> String {
        self.cas.iter().map(|c| c.pem.as_str()).collect()
    }

    /// A client certificate for `agent_id`: its id as the common name and
    /// as a URI (`urn:substrat:agent:ID`), for client authentication only.
    pub fn issue_agent(&self, agent_id: &str) -> Result<AgentCredentials, TlsError> {
        let issuing = self.issuing();
        let (cert, key) = issuing.sign_agent_with_key(agent_id)?;
        issuing.verifies(cert.der()).map_err(|e| {
            TlsError::Invalid(format!(
                "the issuing authority's certificate does not verify what its key signs ({e}): the authority in {} is damaged",
                self.dir.display()
            ))
        })?;
        Ok(AgentCredentials {
            fingerprint: fingerprint(cert.der()),
            cert: cert.pem(),
            key: key.serialize_pem(),
            ca: self.bundle(),
        })
    }

    /// The listener's configuration: a certificate for `names` (DNS names
    /// or IP addresses the relays connect to), and client certificates
    /// required, verified against the authorities trusted.
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
        let signer = &self.cas[self.serving];
        let cert = params.signed_by(&key, &signer.issuer()?)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = client_verifier(&self.cas, provider.clone())?;
        let key =
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).map_err(pem_error)?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(PROTOCOLS)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![cert.der().clone()], key)?;
        Ok(Arc::new(config))
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
