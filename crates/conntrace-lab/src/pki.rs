//! A throw-away certificate authority and a leaf certificate signed by it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::LabError;

/// A test CA plus one leaf certificate (and its key) signed by that CA.
///
/// Every call to a constructor creates a new, independent CA: a client that
/// trusts one `TestPki` rejects the certificates of every other one.
#[derive(Clone)]
pub struct TestPki {
    names: Vec<String>,
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    leaf_der: CertificateDer<'static>,
    leaf_pem: String,
    key_der: Vec<u8>,
    key_pem: String,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

/// Paths of the PEM files written by [`TestPki::write_to_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiFiles {
    /// The CA certificate (`ca.pem`).
    pub ca: PathBuf,
    /// The leaf certificate followed by the CA certificate (`cert.pem`), as
    /// servers such as nginx expect for `ssl_certificate`.
    pub cert: PathBuf,
    /// The leaf's PKCS#8 private key (`key.pem`).
    pub key: PathBuf,
}

/// A process-unique id: wall-clock nanoseconds plus a counter.
fn unique_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}-{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

impl TestPki {
    /// Generates a CA and a leaf certificate valid for `names`.
    ///
    /// Each name that parses as an IP address becomes an IP-address subject
    /// alternative name, every other name a DNS name. Keys are ECDSA P-256.
    ///
    /// # Errors
    /// [`LabError::InvalidConfig`] when `names` is empty,
    /// [`LabError::Certificate`] when rcgen rejects a name or fails to sign.
    pub fn generate(names: &[&str]) -> Result<TestPki, LabError> {
        if names.is_empty() {
            return Err(LabError::InvalidConfig(
                "TestPki::generate needs at least one name".into(),
            ));
        }
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A unique CA name per instance: a client trusting another TestPki
        // then fails with "unknown issuer", as for a real foreign CA.
        ca_params.distinguished_name.push(
            DnType::CommonName,
            format!("conntrace-lab test CA {}", unique_id()),
        );
        ca_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let owned: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut leaf_params = CertificateParams::new(owned.clone())?;
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, names[0]);
        leaf_params.use_authority_key_identifier_extension = true;
        leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate()?;
        let leaf_cert = leaf_params.signed_by(&leaf_key, &issuer)?;

        Ok(TestPki {
            names: owned,
            ca_der: ca_cert.der().clone(),
            ca_pem: ca_cert.pem(),
            leaf_der: leaf_cert.der().clone(),
            leaf_pem: leaf_cert.pem(),
            key_der: leaf_key.serialize_der(),
            key_pem: leaf_key.serialize_pem(),
        })
    }

    /// A self-signed `CA:TRUE` certificate used as the server's own, the
    /// usual one-line `openssl req -x509 -newkey ... -subj /CN=localhost`
    /// certificate (with `localhost`, `127.0.0.1`, `::1` as alternative
    /// names): [`ca_cert_pem`](Self::ca_cert_pem) and
    /// [`leaf_cert_pem`](Self::leaf_cert_pem) are that one certificate,
    /// and the server presents it alone.
    ///
    /// # Errors
    /// [`LabError::Certificate`] when rcgen fails (in practice never).
    pub fn self_signed_localhost() -> Result<TestPki, LabError> {
        let names = ["localhost", "127.0.0.1", "::1"];
        let owned: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(owned.clone())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(
            DnType::CommonName,
            format!("localhost self-signed {}", unique_id()),
        );
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(TestPki {
            names: owned,
            ca_der: cert.der().clone(),
            ca_pem: cert.pem(),
            leaf_der: cert.der().clone(),
            leaf_pem: cert.pem(),
            key_der: key.serialize_der(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Generates a CA and a leaf valid for `localhost`, `127.0.0.1` and `::1`.
    ///
    /// # Errors
    /// As [`TestPki::generate`] (in practice never).
    pub fn localhost() -> Result<TestPki, LabError> {
        Self::generate(&["localhost", "127.0.0.1", "::1"])
    }

    /// Generates a second, independent CA and leaf for the same localhost
    /// names: a client trusting another `TestPki` fails verification against
    /// it with an unknown-issuer error (bad-certificate tests).
    ///
    /// # Errors
    /// As [`TestPki::generate`] (in practice never).
    pub fn untrusted_other() -> Result<TestPki, LabError> {
        Self::localhost()
    }

    /// The names (DNS names and IP addresses) the leaf certificate covers.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The CA certificate, PEM encoded.
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate, DER encoded.
    pub fn ca_cert_der(&self) -> CertificateDer<'static> {
        self.ca_der.clone()
    }

    /// The leaf certificate, PEM encoded (without the CA).
    pub fn leaf_cert_pem(&self) -> &str {
        &self.leaf_pem
    }

    /// The chain a server presents: the leaf, then the CA certificate (DER).
    pub fn leaf_chain_der(&self) -> Vec<CertificateDer<'static>> {
        if self.leaf_der == self.ca_der {
            return vec![self.leaf_der.clone()];
        }
        vec![self.leaf_der.clone(), self.ca_der.clone()]
    }

    /// The leaf's private key (PKCS#8 DER).
    pub fn leaf_key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// The leaf's private key (PKCS#8 PEM, `-----BEGIN PRIVATE KEY-----`).
    pub fn leaf_key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A root store holding only this CA, for rustls clients.
    ///
    /// # Errors
    /// [`LabError::Tls`] if rustls cannot parse the CA certificate (never for
    /// certificates made here).
    pub fn root_store(&self) -> Result<rustls::RootCertStore, LabError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_cert_der())?;
        Ok(roots)
    }

    /// A rustls client configuration (ring provider, TLS 1.2 and 1.3) that
    /// trusts only this CA and offers `alpn` (e.g. `[b"h2".to_vec()]`).
    ///
    /// # Errors
    /// [`LabError::Tls`] if rustls rejects the configuration (never in practice).
    pub fn client_config(&self, alpn: &[&[u8]]) -> Result<Arc<rustls::ClientConfig>, LabError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.root_store()?)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// Writes `ca.pem`, `cert.pem` (leaf then CA) and `key.pem` into `dir`
    /// (which must exist) and returns their paths.
    ///
    /// # Errors
    /// [`LabError::Io`] when a file cannot be written.
    pub fn write_to_dir(&self, dir: &Path) -> Result<PkiFiles, LabError> {
        let files = PkiFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        let chain = format!("{}{}", self.leaf_pem, self.ca_pem);
        for (path, content) in [
            (&files.ca, self.ca_pem.as_str()),
            (&files.cert, chain.as_str()),
            (&files.key, self.key_pem.as_str()),
        ] {
            std::fs::write(path, content)
                .map_err(|e| LabError::io(format!("write {}", path.display()), e))?;
        }
        Ok(files)
    }
}
