//! Named credentials: a principal, the roles it holds, the namespaces it may act in, and one
//! or more secrets, kept only as SHA-256 digests. Several secrets per principal let a secret be
//! rotated while the principal stays the same; the file is read again when it changes, so a
//! rotation needs no restart. Credentials an admin manages over the API are kept in the
//! database and held here beside the file's, read again as they change.
//!
//! ```toml
//! [[credential]]
//! principal = "alice"
//! roles = ["operator"]
//! namespaces = ["billing"]            # absent: every namespace
//! secrets = ["sha256:9f86d081884c…"] # `capstan credentials hash` prints one
//! client_certificates = ["alice.clients.example"] # names a client certificate may carry
//! ```
//!
//! With `--tls-client-ca`, a client certificate whose subjectAltName holds one of a credential's
//! `client_certificates` names (matched as TLS matches a server's name) authenticates as it.

use super::Role;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// The prefix of a stored secret: the digest's algorithm.
const DIGEST_PREFIX: &str = "sha256:";

/// One named credential, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// Who acts: recorded on every fact the credential's requests cause.
    pub principal: String,
    pub roles: BTreeSet<Role>,
    /// The namespaces it may act in; `None` for every namespace.
    pub namespaces: Option<BTreeSet<String>>,
    /// SHA-256 digests of its secrets.
    digests: Vec<[u8; 32]>,
    /// DNS names (or IP addresses) a client certificate's subjectAltName may carry to act as it.
    pub client_certificates: Vec<String>,
}

impl Credential {
    pub fn new(principal: &str, roles: &[Role], namespaces: Option<&[&str]>, secrets: &[&str]) -> Self {
        Self {
            principal: principal.to_string(),
            roles: roles.iter().copied().collect(),
            namespaces: namespaces.map(|names| names.iter().map(|n| n.to_string()).collect()),
            digests: secrets.iter().map(|secret| digest(secret)).collect(),
            client_certificates: Vec::new(),
        }
    }

    /// Whether `certificate` (a verified client certificate) carries one of its names.
    fn accepts_certificate(&self, certificate: &webpki::EndEntityCert) -> bool {
        self.client_certificates.iter().any(|name| {
            rustls::pki_types::ServerName::try_from(name.as_str())
                .is_ok_and(|name| certificate.verify_is_valid_for_subject_name(&name).is_ok())
        })
    }

    /// Whether `presented` (a token's digest) is one of its secrets; every secret is compared
    /// in full, so the time taken does not say which one nearly matched.
    fn accepts(&self, presented: &[u8; 32]) -> bool {
        self.digests
            .iter()
            .fold(false, |found, known| found | constant_time_eq(known, presented))
    }

    pub fn may_act_in(&self, namespace: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|names| names.contains(namespace))
    }

    pub fn secret_count(&self) -> usize {
        self.digests.len()
    }

    /// An admin bound to no namespace: the only credential that may manage credentials.
    pub fn manages_credentials(&self) -> bool {
        self.roles.contains(&Role::Admin) && self.namespaces.is_none()
    }

    /// A credential the database holds; `None` if the record names an unknown role or holds a
    /// malformed digest (written by a newer build, or by hand).
    pub fn from_record(record: &capstan_store::CredentialRecord) -> Option<Self> {
        let roles = record.roles.iter().map(|role| Role::named(role)).collect::<Option<BTreeSet<_>>>()?;
        let digests = record
            .secrets
            .iter()
            .map(|secret| parse_digest(&secret.digest))
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            principal: record.principal.clone(),
            roles,
            namespaces: record.namespaces.as_ref().map(|names| names.iter().cloned().collect()),
            digests,
            client_certificates: Vec::new(),
        })
    }
}

/// The digest a stored form (`sha256:<64 hex digits>`) names.
fn parse_digest(stored: &str) -> Option<[u8; 32]> {
    let hex_digest = stored.strip_prefix(DIGEST_PREFIX)?;
    hex::decode(hex_digest).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
}

/// The SHA-256 digest of a secret.
pub fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// How a secret is written in a credentials file: `sha256:<hex digest>`.
pub fn stored_form(secret: &str) -> String {
    format!("{DIGEST_PREFIX}{}", hex::encode(digest(secret)))
}

/// A new secret: 256 random bits from the operating system, in hex behind a `capstan_` prefix
/// (which lets secret scanners recognise a leaked one).
pub fn generate_secret() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("the operating system's random source failed: {e}"))?;
    Ok(format!("capstan_{}", hex::encode(bytes)))
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The credentials in force, shared by every request: the file's, replaced whole when the file
/// changes, and the database's (managed over the API), replaced whole when they are read again.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    current: Arc<RwLock<Arc<Vec<Credential>>>>,
    managed: Arc<RwLock<Arc<Vec<Credential>>>>,
    source: Option<Arc<Source>>,
}

#[derive(Debug)]
struct Source {
    path: PathBuf,
    /// What the file looked like when it was last read.
    seen: RwLock<Option<(SystemTime, u64)>>,
}

impl Credentials {
    pub fn fixed(credentials: Vec<Credential>) -> Self {
        Self {
            current: Arc::new(RwLock::new(Arc::new(credentials))),
            managed: Arc::default(),
            source: None,
        }
    }

    /// The credentials a file holds, read now; an unreadable or invalid file is an error.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let loaded = read_file(path)?;
        let credentials = Self {
            current: Arc::new(RwLock::new(Arc::new(loaded))),
            managed: Arc::default(),
            source: Some(Arc::new(Source {
                path: path.to_path_buf(),
                seen: RwLock::new(file_stamp(path)),
            })),
        };
        Ok(credentials)
    }

    /// The file these credentials came from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.source.as_ref().map(|source| source.path.as_path())
    }

    /// The credential one of whose secrets `token` is.
    pub fn find(&self, token: &str) -> Option<Credential> {
        let presented = digest(token);
        let (file, managed) = (self.of_file(), self.managed());
        // Every credential is checked (no early exit): the time taken does not tell how many
        // credentials were passed over.
        file.iter()
            .chain(managed.iter())
            .fold(None, |found, credential| match credential.accepts(&presented) {
                true => found.or(Some(credential)),
                false => found,
            })
            .cloned()
    }

    /// The credential a verified client certificate acts as: the first (the file's before the
    /// database's) one of whose `client_certificates` names the certificate carries.
    pub fn for_certificate(&self, certificate: &rustls::pki_types::CertificateDer<'_>) -> Option<Credential> {
        let certificate = webpki::EndEntityCert::try_from(certificate).ok()?;
        let (file, managed) = (self.of_file(), self.managed());
        file.iter()
            .chain(managed.iter())
            .find(|credential| credential.accepts_certificate(&certificate))
            .cloned()
    }

    /// The credential of `principal`.
    pub fn by_principal(&self, principal: &str) -> Option<Credential> {
        let (file, managed) = (self.of_file(), self.managed());
        file.iter().chain(managed.iter()).find(|c| c.principal == principal).cloned()
    }

    /// The credentials the file holds.
    pub fn of_file(&self) -> Arc<Vec<Credential>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The credentials the database holds, as last read.
    pub fn managed(&self) -> Arc<Vec<Credential>> {
        self.managed.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts the database's credentials in force (all of them, replacing the last set); the
    /// principals of records this build cannot read.
    pub fn set_managed(&self, records: &[capstan_store::CredentialRecord]) -> Vec<String> {
        let mut unreadable = Vec::new();
        let loaded = records
            .iter()
            .filter_map(|record| {
                let credential = Credential::from_record(record);
                if credential.is_none() {
                    unreadable.push(record.principal.clone());
                }
                credential
            })
            .collect();
        *self.managed.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(loaded);
        unreadable
    }

    /// Whether the file defines `principal`.
    pub fn file_defines(&self, principal: &str) -> bool {
        self.of_file().iter().any(|credential| credential.principal == principal)
    }

    /// How many credentials the file holds.
    pub fn len(&self) -> usize {
        self.of_file().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the file again if it changed since it was last read: `Ok(Some(n))` when `n`
    /// credentials were loaded, `Ok(None)` when it had not changed. An invalid file leaves the
    /// credentials in force as they were.
    pub fn reload_if_changed(&self) -> Result<Option<usize>, String> {
        let Some(source) = &self.source else { return Ok(None) };
        let stamp = file_stamp(&source.path);
        if *source.seen.read().unwrap_or_else(|e| e.into_inner()) == stamp {
            return Ok(None);
        }
        *source.seen.write().unwrap_or_else(|e| e.into_inner()) = stamp;
        let loaded = read_file(&source.path)?;
        let count = loaded.len();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(loaded);
        Ok(Some(count))
    }
}

fn file_stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    credential: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    principal: String,
    roles: Vec<String>,
    namespaces: Option<Vec<String>>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    client_certificates: Vec<String>,
}

fn read_file(path: &Path) -> Result<Vec<Credential>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("credentials file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("credentials file {}: {e}", path.display()))
}

/// The credentials a file's text holds. Secrets must be stored digests, never plain text.
pub fn parse(text: &str) -> Result<Vec<Credential>, String> {
    let file: File = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let mut principals = BTreeSet::new();
    let mut seen_digests = BTreeSet::new();
    let mut credentials = Vec::with_capacity(file.credential.len());
    for entry in file.credential {
        let principal = entry.principal.trim().to_string();
        if principal.is_empty() || principal.len() > 128 || principal.chars().any(char::is_control) {
            return Err(format!("principal {:?} must be 1-128 printable characters", entry.principal));
        }
        if !principals.insert(principal.clone()) {
            return Err(format!(
                "principal {principal:?} is configured twice (list all its secrets in one entry)"
            ));
        }
        let roles = entry
            .roles
            .iter()
            .map(|role| {
                Role::named(role).ok_or_else(|| format!("principal {principal:?}: unknown role {role:?} (worker, operator, admin)"))
            })
            .collect::<Result<BTreeSet<Role>, String>>()?;
        if roles.is_empty() {
            return Err(format!("principal {principal:?} has no roles"));
        }
        if entry.secrets.is_empty() && entry.client_certificates.is_empty() {
            return Err(format!("principal {principal:?} has no secrets and no client_certificates"));
        }
        for name in &entry.client_certificates {
            if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                return Err(format!(
                    "principal {principal:?}: client certificate name {name:?} is not a DNS name or an IP address"
                ));
            }
        }
        let mut digests = Vec::with_capacity(entry.secrets.len());
        for secret in &entry.secrets {
            if !secret.starts_with(DIGEST_PREFIX) {
                return Err(format!("principal {principal:?}: a secret must be stored as sha256:<hex digest> (`capstan credentials hash` prints one), never in plain text"));
            }
            let bytes = parse_digest(secret).ok_or_else(|| format!("principal {principal:?}: a secret digest must be 64 hex digits"))?;
            if !seen_digests.insert(bytes) {
                return Err(format!(
                    "principal {principal:?}: a secret is listed twice (each secret names one principal)"
                ));
            }
            digests.push(bytes);
        }
        let namespaces = match entry.namespaces {
            None => None,
            Some(names) if names.is_empty() => {
                return Err(format!(
                    "principal {principal:?}: namespaces = [] would allow none; leave it out to allow every namespace"
                ))
            }
            Some(names) => Some(names.into_iter().collect()),
        };
        credentials.push(Credential {
            principal,
            roles,
            namespaces,
            digests,
            client_certificates: entry.client_certificates,
        });
    }
    Ok(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &str) -> String {
        entries.to_string()
    }

    #[test]
    fn a_secret_finds_its_principal_and_a_rotated_principal_keeps_its_name() {
        let text = file(&format!(
            "[[credential]]\nprincipal = \"alice\"\nroles = [\"operator\"]\nsecrets = [\"{}\", \"{}\"]\n\
             [[credential]]\nprincipal = \"bob\"\nroles = [\"worker\"]\nnamespaces = [\"billing\"]\nsecrets = [\"{}\"]\n",
            stored_form("alice-v1"),
            stored_form("alice-v2"),
            stored_form("bob-1")
        ));
        let credentials = Credentials::fixed(parse(&text).unwrap());
        assert_eq!(credentials.find("alice-v1").unwrap().principal, "alice");
        assert_eq!(credentials.find("alice-v2").unwrap().principal, "alice");
        let bob = credentials.find("bob-1").unwrap();
        assert_eq!(bob.roles, BTreeSet::from([Role::Worker]));
        assert!(bob.may_act_in("billing") && !bob.may_act_in("default"));
        assert!(credentials.find("alice-v3").is_none());
        assert!(
            credentials.find(&stored_form("alice-v1")).is_none(),
            "the stored digest is not a secret"
        );
    }

    #[test]
    fn plain_text_secrets_unknown_roles_and_duplicates_are_refused() {
        let plain = "[[credential]]\nprincipal = \"a\"\nroles = [\"admin\"]\nsecrets = [\"hunter2\"]\n";
        assert!(parse(plain).unwrap_err().contains("never in plain text"));
        let role = format!(
            "[[credential]]\nprincipal = \"a\"\nroles = [\"root\"]\nsecrets = [\"{}\"]\n",
            stored_form("x")
        );
        assert!(parse(&role).unwrap_err().contains("unknown role"));
        let twice = format!(
            "[[credential]]\nprincipal = \"a\"\nroles = [\"admin\"]\nsecrets = [\"{0}\"]\n[[credential]]\nprincipal = \"b\"\nroles = [\"admin\"]\nsecrets = [\"{0}\"]\n",
            stored_form("same")
        );
        assert!(parse(&twice).unwrap_err().contains("listed twice"));
        let unknown = format!(
            "[[credential]]\nprincipal = \"a\"\nroles = [\"admin\"]\nsecret = [\"{}\"]\n",
            stored_form("x")
        );
        assert!(parse(&unknown).is_err());
    }

    #[test]
    fn a_changed_file_is_read_again_and_an_invalid_one_leaves_the_old_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials.toml");
        let write = |secret: &str| {
            let text = format!(
                "[[credential]]\nprincipal = \"alice\"\nroles = [\"operator\"]\nsecrets = [\"{}\"]\n",
                stored_form(secret)
            );
            std::fs::write(&path, text).unwrap();
        };
        write("first");
        let credentials = Credentials::from_file(&path).unwrap();
        assert!(credentials.find("first").is_some());
        assert_eq!(credentials.reload_if_changed().unwrap(), None);
        write("second-and-longer");
        assert_eq!(credentials.reload_if_changed().unwrap(), Some(1));
        assert!(credentials.find("first").is_none() && credentials.find("second-and-longer").is_some());
        std::fs::write(&path, "not toml [").unwrap();
        assert!(credentials.reload_if_changed().is_err());
        assert!(
            credentials.find("second-and-longer").is_some(),
            "an invalid file keeps what was in force"
        );
    }

    #[test]
    fn a_credential_may_name_client_certificates_instead_of_secrets() {
        let text = "[[credential]]\nprincipal = \"w\"\nroles = [\"worker\"]\nclient_certificates = [\"w.example\", \"10.0.0.7\"]\n";
        let parsed = parse(text).unwrap();
        assert_eq!(parsed[0].client_certificates, ["w.example", "10.0.0.7"]);
        assert_eq!(parsed[0].secret_count(), 0);
        let neither = "[[credential]]\nprincipal = \"w\"\nroles = [\"worker\"]\n";
        assert!(parse(neither).unwrap_err().contains("no secrets and no client_certificates"));
        let bad = "[[credential]]\nprincipal = \"w\"\nroles = [\"worker\"]\nclient_certificates = [\"not a name\"]\n";
        assert!(parse(bad).unwrap_err().contains("not a DNS name"));
        let credentials = Credentials::fixed(parsed);
        assert_eq!(credentials.by_principal("w").map(|c| c.principal), Some("w".to_string()));
        assert!(credentials
            .for_certificate(&rustls::pki_types::CertificateDer::from(vec![0u8; 3]))
            .is_none());
    }
}
