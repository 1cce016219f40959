//! The external-scaler port's mutual TLS material: one CA that exists only for this port, the
//! Sentinel's serving certificate and KEDA's client certificate, both signed by it. What is
//! there and still good is kept; what is missing, broken or due is issued again.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
};
use std::collections::BTreeMap;
use time::{Duration, OffsetDateTime};
use x509_parser::pem::parse_x509_pem;

/// As long as the certificates the chart used to make at install: nothing on this port rotates
/// them on a schedule (cert-manager Secrets do, for those who need it).
pub const LIFETIME: Duration = Duration::days(3650);

/// The data of the three Secrets, key → PEM text.
pub type SecretData = BTreeMap<String, String>;

pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const CERT: &str = "tls.crt";
pub const KEY: &str = "tls.key";

/// What is stored now (`None`: no such Secret).
pub struct Stored<'a> {
    pub ca: Option<&'a SecretData>,
    pub server: Option<&'a SecretData>,
    pub client: Option<&'a SecretData>,
}

/// The Secrets to write; `None` leaves one as it is.
#[derive(Debug, Default)]
pub struct Issued {
    pub ca: Option<SecretData>,
    pub server: Option<SecretData>,
    pub client: Option<SecretData>,
}

/// Decides and issues. `server_names` are the DNS names KEDA dials the Sentinel by.
pub fn ensure(
    stored: Stored<'_>,
    common_name: &str,
    server_names: &[String],
    now: OffsetDateTime,
) -> Result<Issued, String> {
    let ca = stored.ca.and_then(|data| usable_ca(data, now));
    let trusted = ca.as_ref().map(|ca| ca.cert_pem.as_str());
    let server_ok = stored
        .server
        .is_some_and(|data| usable_leaf(data, trusted, Some(server_names), now));
    let client_ok = stored
        .client
        .is_some_and(|data| usable_leaf(data, trusted, None, now));
    // Both sides must trust the same CA: the Sentinel checks KEDA's certificate against its
    // Secret's ca.crt, KEDA the Sentinel's against its own.
    let same_ca = match (stored.server, stored.client) {
        (Some(s), Some(c)) => s.get(CA_CERT) == c.get(CA_CERT),
        _ => false,
    };
    if server_ok && client_ok && same_ca {
        // Certificates an older chart made come without a CA Secret: they are kept while they
        // are good, and a new CA is made only when one of them has to be issued again.
        return Ok(Issued::default());
    }
    // With a usable CA, each certificate that is still good was issued with it (checked above),
    // so only the others are issued again; without one, a new CA and both certificates.
    let (ca, new_ca) = match ca {
        Some(ca) => (ca, None),
        None => {
            let ca = new_ca(common_name, now)?;
            let data = ca.secret_data();
            (ca, Some(data))
        }
    };
    let fresh = new_ca.is_some();
    Ok(Issued {
        server: (fresh || !server_ok)
            .then(|| ca.issue_server(common_name, server_names, now))
            .transpose()?,
        client: (fresh || !client_ok)
            .then(|| ca.issue_client(now))
            .transpose()?,
        ca: new_ca,
    })
}

struct Ca {
    cert_pem: String,
    key: KeyPair,
}

impl Ca {
    fn secret_data(&self) -> SecretData {
        SecretData::from([
            (CA_CERT.to_string(), self.cert_pem.clone()),
            (CA_KEY.to_string(), self.key.serialize_pem()),
        ])
    }

    fn issue_server(
        &self,
        common_name: &str,
        names: &[String],
        now: OffsetDateTime,
    ) -> Result<SecretData, String> {
        let mut params = CertificateParams::new(names.to_vec())
            .map_err(|e| format!("server certificate names {names:?}: {e}"))?;
        params.distinguished_name = name(common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, now)
    }

    fn issue_client(&self, now: OffsetDateTime) -> Result<SecretData, String> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name("keda-operator");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, now)
    }

    fn issue(
        &self,
        mut params: CertificateParams,
        now: OffsetDateTime,
    ) -> Result<SecretData, String> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.not_before = now - Duration::minutes(5);
        params.not_after = now + LIFETIME;
        let key = KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)
            .map_err(|e| format!("cannot sign with the CA: {e}"))?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|e| format!("cannot sign a certificate: {e}"))?;
        Ok(SecretData::from([
            (CERT.to_string(), cert.pem()),
            (KEY.to_string(), key.serialize_pem()),
            (CA_CERT.to_string(), self.cert_pem.clone()),
        ]))
    }
}

fn new_ca(common_name: &str, now: OffsetDateTime) -> Result<Ca, String> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(&format!("{common_name}-external-scaler-ca"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + LIFETIME;
    let key = KeyPair::generate().map_err(|e| format!("cannot make the CA's key: {e}"))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("cannot make the CA: {e}"))?;
    Ok(Ca {
        cert_pem: cert.pem(),
        key,
    })
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// The stored CA, if its certificate and key parse, belong together and it is not due.
fn usable_ca(data: &SecretData, now: OffsetDateTime) -> Option<Ca> {
    let cert_pem = data.get(CA_CERT)?;
    let key = KeyPair::from_pem(data.get(CA_KEY)?).ok()?;
    let checked = Checked::parse(cert_pem, &key)?;
    (!checked.due(now)).then(|| Ca {
        cert_pem: cert_pem.clone(),
        key,
    })
}

/// Whether a stored serving or client certificate can stay: it parses, its key is the
/// certificate's, it is not due, it carries every wanted name and, when the CA is known, was
/// issued with it.
fn usable_leaf(
    data: &SecretData,
    ca_pem: Option<&str>,
    wanted_names: Option<&[String]>,
    now: OffsetDateTime,
) -> bool {
    let (Some(cert), Some(key), Some(ca)) = (data.get(CERT), data.get(KEY), data.get(CA_CERT))
    else {
        return false;
    };
    let Ok(key) = KeyPair::from_pem(key) else {
        return false;
    };
    let Some(checked) = Checked::parse(cert, &key) else {
        return false;
    };
    let names_ok =
        wanted_names.is_none_or(|wanted| wanted.iter().all(|n| checked.names.contains(n)));
    let ca_ok = ca_pem.is_none_or(|pem| pem == ca);
    names_ok && ca_ok && !checked.due(now)
}

/// What the decision reads of a certificate whose key was given.
struct Checked {
    not_before: i64,
    not_after: i64,
    names: Vec<String>,
}

impl Checked {
    fn parse(pem: &str, key: &KeyPair) -> Option<Checked> {
        let (_, pem) = parse_x509_pem(pem.as_bytes()).ok()?;
        let cert = pem.parse_x509().ok()?;
        if cert.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
            return None;
        }
        let names = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Checked {
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            names,
        })
    }

    /// Due in its last third, as cert-manager renews by default.
    fn due(&self, now: OffsetDateTime) -> bool {
        let lifetime = self.not_after - self.not_before;
        now.unix_timestamp() >= self.not_after - lifetime / 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["astro-sentinel".into(), "astro-sentinel.ns.svc".into()]
    }

    fn fresh(now: OffsetDateTime) -> (SecretData, SecretData, SecretData) {
        let issued = ensure(
            Stored {
                ca: None,
                server: None,
                client: None,
            },
            "astro-sentinel",
            &names(),
            now,
        )
        .unwrap();
        (
            issued.ca.unwrap(),
            issued.server.unwrap(),
            issued.client.unwrap(),
        )
    }

    fn again(
        ca: Option<&SecretData>,
        server: Option<&SecretData>,
        client: Option<&SecretData>,
        names: &[String],
        now: OffsetDateTime,
    ) -> Issued {
        ensure(Stored { ca, server, client }, "astro-sentinel", names, now).unwrap()
    }

    #[test]
    fn nothing_stored_issues_a_ca_and_both_certificates_signed_by_it() {
        let now = OffsetDateTime::now_utc();
        let (ca, server, client) = fresh(now);
        assert_eq!(server[CA_CERT], ca[CA_CERT]);
        assert_eq!(client[CA_CERT], ca[CA_CERT]);
        let key = KeyPair::from_pem(&server[KEY]).unwrap();
        let checked = Checked::parse(&server[CERT], &key).unwrap();
        assert_eq!(checked.names, names());
        assert!(!checked.due(now));
    }

    #[test]
    fn what_is_good_is_kept() {
        let now = OffsetDateTime::now_utc();
        let (ca, server, client) = fresh(now);
        let issued = again(Some(&ca), Some(&server), Some(&client), &names(), now);
        assert!(issued.ca.is_none() && issued.server.is_none() && issued.client.is_none());
    }

    #[test]
    fn certificates_without_a_ca_secret_are_kept_until_one_must_be_issued() {
        let now = OffsetDateTime::now_utc();
        let (_, server, client) = fresh(now);
        let kept = again(None, Some(&server), Some(&client), &names(), now);
        assert!(kept.ca.is_none() && kept.server.is_none() && kept.client.is_none());

        let mut more = names();
        more.push("astro-sentinel.ns.svc.cluster.local".into());
        let reissued = again(None, Some(&server), Some(&client), &more, now);
        let ca = reissued.ca.expect("a new CA");
        assert_eq!(reissued.server.unwrap()[CA_CERT], ca[CA_CERT]);
        assert_eq!(reissued.client.unwrap()[CA_CERT], ca[CA_CERT]);
    }

    #[test]
    fn a_missing_name_reissues_only_the_serving_certificate() {
        let now = OffsetDateTime::now_utc();
        let (ca, server, client) = fresh(now);
        let mut more = names();
        more.push("other".into());
        let issued = again(Some(&ca), Some(&server), Some(&client), &more, now);
        assert!(issued.ca.is_none() && issued.client.is_none());
        assert_eq!(issued.server.unwrap()[CA_CERT], ca[CA_CERT]);
    }

    #[test]
    fn a_key_that_does_not_fit_or_a_broken_certificate_is_replaced() {
        let now = OffsetDateTime::now_utc();
        let (ca, server, client) = fresh(now);
        let mut swapped = client.clone();
        swapped.insert(KEY.into(), server[KEY].clone());
        let issued = again(Some(&ca), Some(&server), Some(&swapped), &names(), now);
        assert!(issued.client.is_some() && issued.server.is_none() && issued.ca.is_none());

        let mut broken = server.clone();
        broken.insert(CERT.into(), "not PEM".into());
        let issued = again(Some(&ca), Some(&broken), Some(&client), &names(), now);
        assert!(issued.server.is_some() && issued.client.is_none());
    }

    #[test]
    fn certificates_in_their_last_third_are_renewed_with_a_new_ca_when_it_is_due_too() {
        let then = OffsetDateTime::now_utc() - Duration::days(2500);
        let (ca, server, client) = fresh(then);
        let now = OffsetDateTime::now_utc();
        let issued = again(Some(&ca), Some(&server), Some(&client), &names(), now);
        let new_ca = issued.ca.expect("the CA is due too");
        assert_ne!(new_ca[CA_CERT], ca[CA_CERT]);
        assert_eq!(issued.server.unwrap()[CA_CERT], new_ca[CA_CERT]);
        assert_eq!(issued.client.unwrap()[CA_CERT], new_ca[CA_CERT]);
    }

    #[test]
    fn leaves_of_another_ca_are_issued_again_by_the_stored_one() {
        let now = OffsetDateTime::now_utc();
        let (ca, server, _) = fresh(now);
        let (_, _, foreign_client) = fresh(now);
        let issued = again(
            Some(&ca),
            Some(&server),
            Some(&foreign_client),
            &names(),
            now,
        );
        assert!(issued.ca.is_none());
        assert_eq!(issued.client.unwrap()[CA_CERT], ca[CA_CERT]);
    }
}
