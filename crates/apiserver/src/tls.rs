//! The server's PKI and kubeconfig: a CA, a serving certificate and an admin client
//! certificate, created on first start in `data_dir/pki/` and reused afterwards.
//!
//! Authentication is by client certificate: the TLS layer verifies any certificate a client
//! presents against the CA (but lets clients without one finish the handshake, so `/readyz`
//! works with plain `curl -k`); the HTTP layer then answers 401 to unauthenticated requests.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject};

use crate::ServerError;

/// PEM material of the cluster.
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    pub(crate) serving_cert_pem: String,
    pub(crate) serving_key_pem: String,
    pub(crate) client_cert_pem: String,
    pub(crate) client_key_pem: String,
}

fn pki_err(what: &str, e: impl std::fmt::Display) -> ServerError {
    ServerError::Pki(format!("{what}: {e}"))
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "svcnet-ca");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    params
}

fn read(path: &Path) -> Result<Option<String>, ServerError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(pki_err(&path.display().to_string(), e)),
    }
}

fn write(path: &Path, contents: &str, private: bool) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(|e| pki_err(&tmp.display().to_string(), e))?;
    f.write_all(contents.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| pki_err(&tmp.display().to_string(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| pki_err(&path.display().to_string(), e))
}

/// Loads the PKI from `dir`, creating what is missing. The serving certificate is re-issued
/// when the wanted subject alternative names change (for example a new listen address).
pub(crate) fn ensure_pki(dir: &Path, sans: &[String]) -> Result<Pki, ServerError> {
    std::fs::create_dir_all(dir).map_err(|e| pki_err(&dir.display().to_string(), e))?;
    let p = |name: &str| dir.join(name);

    let (ca_key, ca_pem) = match (read(&p("ca.key"))?, read(&p("ca.crt"))?) {
        (Some(key), Some(cert)) => (
            KeyPair::from_pem(&key).map_err(|e| pki_err("ca.key", e))?,
            cert,
        ),
        _ => {
            let key = KeyPair::generate().map_err(|e| pki_err("CA key", e))?;
            let cert = ca_params()
                .self_signed(&key)
                .map_err(|e| pki_err("CA certificate", e))?;
            write(&p("ca.key"), &key.serialize_pem(), true)?;
            write(&p("ca.crt"), &cert.pem(), false)?;
            // A new CA invalidates every certificate it did not sign.
            for stale in ["apiserver.crt", "admin.crt"] {
                let _ = std::fs::remove_file(p(stale));
            }
            (key, cert.pem())
        }
    };
    let issuer = Issuer::new(ca_params(), ca_key);

    let wanted_sans = sans.join(",");
    let serving = match (
        read(&p("apiserver.key"))?,
        read(&p("apiserver.crt"))?,
        read(&p("apiserver.sans"))?,
    ) {
        (Some(key), Some(cert), Some(have)) if have == wanted_sans => (cert, key),
        _ => {
            let mut params = CertificateParams::new(sans.to_vec())
                .map_err(|e| pki_err("serving certificate names", e))?;
            params
                .distinguished_name
                .push(DnType::CommonName, "svcnet-apiserver");
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let key = KeyPair::generate().map_err(|e| pki_err("serving key", e))?;
            let cert = params
                .signed_by(&key, &issuer)
                .map_err(|e| pki_err("serving certificate", e))?;
            write(&p("apiserver.key"), &key.serialize_pem(), true)?;
            write(&p("apiserver.crt"), &cert.pem(), false)?;
            write(&p("apiserver.sans"), &wanted_sans, false)?;
            (cert.pem(), key.serialize_pem())
        }
    };

    let client = match (read(&p("admin.key"))?, read(&p("admin.crt"))?) {
        (Some(key), Some(cert)) => (cert, key),
        _ => {
            let mut params = CertificateParams::default();
            params
                .distinguished_name
                .push(DnType::CommonName, "svcnet-admin");
            params
                .distinguished_name
                .push(DnType::OrganizationName, "system:masters");
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let key = KeyPair::generate().map_err(|e| pki_err("client key", e))?;
            let cert = params
                .signed_by(&key, &issuer)
                .map_err(|e| pki_err("client certificate", e))?;
            write(&p("admin.key"), &key.serialize_pem(), true)?;
            write(&p("admin.crt"), &cert.pem(), false)?;
            (cert.pem(), key.serialize_pem())
        }
    };

    Ok(Pki {
        ca_pem,
        serving_cert_pem: serving.0,
        serving_key_pem: serving.1,
        client_cert_pem: client.0,
        client_key_pem: client.1,
    })
}

/// The names the serving certificate covers: loopback, the `kubernetes` service's names and
/// cluster IP (what in-cluster clients dial), the listen, advertised and extra addresses.
pub(crate) fn serving_sans(listen: SocketAddr, advertise: IpAddr, extra: &[IpAddr]) -> Vec<String> {
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
    ];
    for ip in [listen.ip(), advertise].iter().chain(extra) {
        if !ip.is_unspecified() && !sans.contains(&ip.to_string()) {
            sans.push(ip.to_string());
        }
    }
    sans
}

/// rustls configuration: the serving certificate, optional client certificates verified
/// against the CA, ALPN h2 and http/1.1.
pub(crate) fn server_tls(pki: &Pki) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca =
        CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).map_err(|e| pki_err("ca.crt", e))?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).map_err(|e| pki_err("ca.crt", e))?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| pki_err("client verifier", e))?;
    let chain = vec![
        CertificateDer::from_pem_slice(pki.serving_cert_pem.as_bytes())
            .map_err(|e| pki_err("apiserver.crt", e))?,
    ];
    let key = PrivateKeyDer::from_pem_slice(pki.serving_key_pem.as_bytes())
        .or_else(|_| {
            PrivatePkcs8KeyDer::from_pem_slice(pki.serving_key_pem.as_bytes()).map(Into::into)
        })
        .map_err(|e| pki_err("apiserver.key", e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| pki_err("TLS versions", e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| pki_err("serving certificate", e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Writes `data_dir/kubeconfig` (mode 0600) for the admin credential; returns its path.
pub(crate) fn write_kubeconfig(
    data_dir: &Path,
    server_url: &str,
    pki: &Pki,
) -> Result<PathBuf, ServerError> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: svcnet
  cluster:
    server: {server_url}
    certificate-authority-data: {ca}
users:
- name: svcnet-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: svcnet
  context:
    cluster: svcnet
    user: svcnet-admin
    namespace: default
current-context: svcnet
preferences: {{}}
",
        ca = b64(&pki.ca_pem),
        cert = b64(&pki.client_cert_pem),
        key = b64(&pki.client_key_pem),
    );
    let path = data_dir.join("kubeconfig");
    write(&path, &text, true)?;
    Ok(path)
}
