//! The pool key, as hyper-util keys its pool: scheme, host, port.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::{Arc, LazyLock};

use opentelemetry::{KeyValue, StringValue};

use crate::semconv;

/// A pool key as hyper-util keys its pool: scheme, host, port.
///
/// The strings are shared (`Arc<str>`): the key is cloned into the pool
/// maps and its attributes onto every request's metrics and spans, and a
/// shared string is a reference count where a `String` is an allocation
/// (and another one in each exported copy of the span).
///
/// The key is hashed once, when it is made (SipHash with the process's
/// random keys, as `std`'s maps): a request looks its host up in several
/// maps, and each lookup hashing the strings again cost more than the
/// rest of the lookup. `Hash` writes that one number.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct HostKey {
    /// First: keys that differ usually differ here, and compare no further.
    hash: u64,
    pub(crate) scheme: Arc<str>,
    pub(crate) host: Arc<str>,
    pub(crate) port: u16,
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKey")
            .field("scheme", &self.scheme)
            .field("host", &self.host)
            .field("port", &self.port)
            .finish()
    }
}

impl Hash for HostKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A map keyed by [`HostKey`] that takes the key's hash as it is (it is
/// SipHash's already) instead of hashing it again.
pub(crate) type HostMap<V> = HashMap<HostKey, V, BuildHasherDefault<KeyHash>>;

/// The hasher of [`HostMap`]: the hash a [`HostKey`] carries, as is.
#[derive(Debug, Default)]
pub(crate) struct KeyHash(u64);

impl Hasher for KeyHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    /// Not called for a [`HostKey`] (it writes one `u64`); FNV-1a, so
    /// any other input still spreads.
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

static HTTP: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("http"));
static HTTPS: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("https"));
/// The keys of the one hash each [`HostKey`] carries.
static KEY_HASH: LazyLock<RandomState> = LazyLock::new(RandomState::new);

impl HostKey {
    /// The key of `scheme://host:port` (`host` without IPv6 brackets).
    /// `http` and `https` share one string each.
    pub(crate) fn new(scheme: &str, host: &str, port: u16) -> Self {
        let scheme = match scheme {
            "https" => HTTPS.clone(),
            "http" => HTTP.clone(),
            other => Arc::from(other),
        };
        Self {
            hash: KEY_HASH.hash_one((&*scheme, host, port)),
            scheme,
            host: Arc::from(host),
            port,
        }
    }

    /// `server.address`, `server.port`, `url.scheme` (an array: callers
    /// add them to a vec of their own, no allocation here).
    pub(crate) fn attributes(&self) -> [KeyValue; 3] {
        [
            KeyValue::new(semconv::SERVER_ADDRESS, self.server_address()),
            KeyValue::new(semconv::SERVER_PORT, i64::from(self.port)),
            KeyValue::new(semconv::URL_SCHEME, self.url_scheme()),
        ]
    }

    /// The `server.address` value (shares the key's string).
    pub(crate) fn server_address(&self) -> StringValue {
        StringValue::from(self.host.clone())
    }

    /// The `url.scheme` value (shares the key's string).
    pub(crate) fn url_scheme(&self) -> StringValue {
        StringValue::from(self.scheme.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_made_apart_find_each_other_in_a_host_map() {
        let mut map = HostMap::default();
        map.insert(HostKey::new("https", "example.com", 443), 1);
        map.insert(HostKey::new("http", "example.com", 80), 2);
        map.insert(HostKey::new("https", "example.com", 8443), 3);
        assert_eq!(
            map.get(&HostKey::new("https", "example.com", 443)),
            Some(&1)
        );
        assert_eq!(map.get(&HostKey::new("http", "example.com", 80)), Some(&2));
        assert_eq!(
            map.get(&HostKey::new("https", "example.com", 8443)),
            Some(&3)
        );
        assert_eq!(map.get(&HostKey::new("https", "example.org", 443)), None);
        assert_eq!(map.get(&HostKey::new("ftp", "example.com", 443)), None);
        assert_eq!(
            HostKey::new("https", "a", 1),
            HostKey::new(&String::from("https"), &String::from("a"), 1)
        );
    }

    #[test]
    fn debug_shows_the_key_not_its_hash() {
        assert_eq!(
            format!("{:?}", HostKey::new("https", "example.com", 443)),
            r#"HostKey { scheme: "https", host: "example.com", port: 443 }"#
        );
    }
}
