//! No open door by accident (`docs/deploy.md`, "Exposure"): where `serve` listens decides what
//! it demands of authentication. On a loopback address only this machine can reach the server;
//! on any other, whoever reaches the port could start, terminate and read every workflow unless
//! requests are authenticated, and bearer tokens cross the network in clear text without TLS.

use std::net::SocketAddr;

/// The flag that lets `--auth none` serve on a network address (a proxy in front authenticates).
pub const ALLOW_FLAG: &str = "--allow-unauthenticated-network";

/// A setting that starts, but that an operator must know about: logged loudly at start, printed
/// by `--check-config`, and shown on `GET /api/cluster/info` under `diagnostics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub code: &'static str,
    pub message: String,
}

/// How `serve` is reached and authenticated.
pub struct Listening<'a> {
    /// `--listen` as given, for messages.
    pub listen: &'a str,
    /// The addresses it resolves to.
    pub addresses: &'a [SocketAddr],
    pub unauthenticated: bool,
    pub tls: bool,
    /// [`ALLOW_FLAG`] was given.
    pub allow_unauthenticated: bool,
}

/// Whether any of `addresses` can be reached from another machine (an unspecified address such
/// as `0.0.0.0` listens on every interface).
pub fn reachable_from_network(addresses: &[SocketAddr]) -> bool {
    addresses.iter().any(|address| !address.ip().is_loopback())
}

/// Refuses an unauthenticated server on a network address unless [`ALLOW_FLAG`] allows it;
/// otherwise the warnings its settings deserve.
pub fn assess(listening: &Listening) -> Result<Vec<Warning>, String> {
    if !reachable_from_network(listening.addresses) {
        return Ok(Vec::new());
    }
    let listen = listening.listen;
    let mut warnings = Vec::new();
    if listening.unauthenticated {
        if !listening.allow_unauthenticated {
            return Err(format!(
                "--listen {listen} can be reached from the network and --auth is none: anyone who reaches it could start, \
                 terminate and read every workflow. Set --auth token (docs/principals.md), require client certificates \
                 (--tls-client-ca), or pass {ALLOW_FLAG} \
                 (CAPSTAN_ALLOW_UNAUTHENTICATED_NETWORK=true) when a proxy in front authenticates every request"
            ));
        }
        warnings.push(Warning {
            code: "unauthenticated_network_listener",
            message: format!(
                "--listen {listen} can be reached from the network with --auth none ({ALLOW_FLAG}): every request is \
                 served without authentication; something in front must authenticate"
            ),
        });
    } else if !listening.tls {
        warnings.push(Warning {
            code: "plaintext_network_listener",
            message: format!(
                "--listen {listen} can be reached from the network without TLS: bearer tokens and payloads cross it in \
                 clear text; put a TLS-terminating proxy in front"
            ),
        });
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Vec<SocketAddr> {
        vec![text.parse().unwrap()]
    }

    fn assessed(address: &str, unauthenticated: bool, allow_unauthenticated: bool) -> Result<Vec<&'static str>, String> {
        let addresses = at(address);
        let listening = Listening {
            listen: address,
            addresses: &addresses,
            unauthenticated,
            tls: false,
            allow_unauthenticated,
        };
        assess(&listening).map(|warnings| warnings.iter().map(|w| w.code).collect())
    }

    #[test]
    fn loopback_is_quiet_whatever_the_authentication() {
        assert_eq!(assessed("127.0.0.1:8080", true, false), Ok(vec![]));
        assert_eq!(assessed("[::1]:8080", true, false), Ok(vec![]));
        assert_eq!(assessed("127.0.0.1:8080", false, false), Ok(vec![]));
    }

    #[test]
    fn a_network_address_without_authentication_is_refused_unless_allowed() {
        for address in ["0.0.0.0:8080", "[::]:8080", "10.1.2.3:8080"] {
            let refused = assessed(address, true, false).unwrap_err();
            assert!(refused.contains(ALLOW_FLAG) && refused.contains("--auth token"), "{refused}");
            assert_eq!(assessed(address, true, true), Ok(vec!["unauthenticated_network_listener"]));
        }
    }

    #[test]
    fn tokens_on_a_network_address_without_tls_are_warned_about() {
        assert_eq!(assessed("0.0.0.0:8080", false, false), Ok(vec!["plaintext_network_listener"]));
    }
}
