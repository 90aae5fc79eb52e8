//! Tenancy over the whole route table: a credential bound to one namespace, holding every role,
//! is refused `403 forbidden` by every route of every other namespace and by every route that
//! spans namespaces. The routes come from the server itself (each route's request series is
//! declared on `/metrics` from start-up), so a route added later is checked without anyone
//! remembering to list it here.

use super::*;
use capstan_server::auth::{Credential, Credentials};
use capstan_server::{AuthConfig, Role};

const ROOT: &str = "tenancy-root-secret-everywhere";
const TENANT: &str = "tenancy-tenant-secret-billing";

/// Routes a bound credential may call outside its namespaces: they show nothing of any
/// namespace (health, readiness, cluster info, whoami), show it only its own (the namespace
/// list, `/metrics`), or are the web UI's static files.
const OPEN_TO_A_TENANT: &[&str] = &[
    "/api/health",
    "/api/ready",
    "/api/cluster/info",
    "/api/auth/whoami",
    "/api/namespaces",
    "/metrics",
];

/// Routes that span namespaces: refused to a bound credential whatever namespace it names.
const SPANNING: &[(&str, &str)] = &[
    ("POST", "/api/namespaces"),
    ("DELETE", "/api/namespaces/billing"),
    ("GET", "/api/system/metrics"),
    ("GET", "/api/system/operator-metrics"),
    ("GET", "/api/system/repair"),
    ("POST", "/api/system/repair/pass"),
    ("GET", "/api/system/activity-timeouts"),
    ("POST", "/api/system/activity-timeouts/pass"),
    ("GET", "/api/system/retention"),
    ("POST", "/api/system/retention/pass"),
    ("GET", "/api/system/run-counts"),
    ("POST", "/api/system/run-counts/rebuild"),
    ("GET", "/api/auth/credentials"),
    ("POST", "/api/auth/credentials"),
    ("GET", "/api/auth/credentials/someone"),
    ("PUT", "/api/auth/credentials/someone"),
    ("DELETE", "/api/auth/credentials/someone"),
    ("POST", "/api/auth/credentials/someone/secrets"),
    ("DELETE", "/api/auth/credentials/someone/secrets/s1"),
];

async fn tenancy_harness() -> Harness {
    let every_role = [Role::Worker, Role::Operator, Role::Admin];
    let credentials = Credentials::fixed(vec![
        Credential::new("root", &every_role, None, &[ROOT]),
        Credential::new("tenant", &every_role, Some(&["billing"]), &[TENANT]),
    ]);
    let auth = AuthConfig::Token {
        shared: None,
        worker: None,
        operator: None,
        admin: None,
        credentials,
    };
    let config = ServerConfig {
        auth,
        ..ServerConfig::default()
    };
    let h = Harness::with_config(config, None).await;
    let create = h
        .bare(Method::POST, "/api/namespaces")
        .header(CONTROL_HEADER, "2")
        .bearer_auth(ROOT)
        .json(&json!({"name": "billing"}));
    send(create).await.ok(201);
    h
}

/// Every route template the server serves, from the request series it declares.
async fn declared_routes(h: &Harness) -> Vec<String> {
    let text = h
        .bare(Method::GET, "/metrics")
        .bearer_auth(ROOT)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut routes: Vec<String> = text
        .lines()
        .filter(|line| line.starts_with("capstan_http_requests_total{"))
        .filter_map(|line| line.split("route=\"").nth(1)?.split('"').next().map(str::to_string))
        .filter(|route| route != "unmatched")
        .collect();
    routes.sort();
    routes.dedup();
    routes
}

/// A concrete path for a template: the namespace's own name where a route takes one from the
/// path, a placeholder for every other parameter.
fn concrete(template: &str, namespace: &str) -> String {
    template
        .split('/')
        .map(|segment| match segment {
            ":name" => namespace,
            s if s.starts_with(':') => "x",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether `template` is the route of `path`.
fn serves(template: &str, path: &str) -> bool {
    let (route, concrete): (Vec<_>, Vec<_>) = (template.split('/').collect(), path.split('/').collect());
    route.len() == concrete.len() && route.iter().zip(&concrete).all(|(r, p)| r == p || r.starts_with(':'))
}

fn request(h: &Harness, method: &Method, path: &str, namespace: &str) -> reqwest::RequestBuilder {
    let version = if path.starts_with("/api/worker/") {
        ("X-Durable-Workflow-Protocol-Version", "1.20")
    } else {
        (CONTROL_HEADER, "2")
    };
    let request = h
        .bare(method.clone(), path)
        .header(version.0, version.1)
        .header("X-Namespace", namespace)
        .bearer_auth(TENANT);
    match *method {
        Method::GET | Method::DELETE => request,
        _ => request.json(&json!({})),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_credential_is_refused_by_every_route_of_another_namespace() {
    let h = tenancy_harness().await;
    let routes = declared_routes(&h).await;
    assert!(routes.len() > 100, "the route table is declared on /metrics: {routes:?}");
    let mut checked = 0;
    for template in routes
        .iter()
        .filter(|route| route.starts_with("/api") && !OPEN_TO_A_TENANT.contains(&route.as_str()))
    {
        let path = concrete(template, "default");
        let mut served = 0;
        for method in [Method::GET, Method::POST, Method::PUT, Method::DELETE] {
            let answer = send(request(&h, &method, &path, "default")).await;
            if answer.status == 405 {
                continue; // the route does not serve this method
            }
            served += 1;
            assert_eq!(
                (answer.status.as_u16(), answer.body["reason"].as_str()),
                (403, Some("forbidden")),
                "{method} {template} answered a credential bound to billing in default: {}",
                answer.body
            );
        }
        assert!(served > 0, "{template} served no method");
        checked += 1;
    }
    assert!(checked > 100, "{checked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_credential_is_refused_by_every_route_that_spans_namespaces() {
    let h = tenancy_harness().await;
    let routes = declared_routes(&h).await;
    for (method, path) in SPANNING {
        assert!(routes.iter().any(|route| serves(route, path)), "{path} is not a route any more");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let answer = send(request(&h, &method, path, "billing")).await;
        assert_eq!(
            (answer.status.as_u16(), answer.body["reason"].as_str()),
            (403, Some("forbidden")),
            "{method} {path} answered a credential bound to billing, in billing: {}",
            answer.body
        );
    }
    // Its own namespace works; the list shows only it.
    let listed = send(request(&h, &Method::GET, "/api/namespaces", "billing")).await.ok(200);
    assert_eq!(listed["namespaces"].as_array().map(Vec::len), Some(1), "{listed}");
    send(request(&h, &Method::GET, "/api/workflows", "billing")).await.ok(200);
}
