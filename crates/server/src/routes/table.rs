//! A route table that remembers its paths, so the request metrics can declare each route's
//! series before the first request (axum's `Router` does not list its routes).

use crate::Shared;
use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, Route};
use axum::Router;
use std::convert::Infallible;
use tower::{Layer, Service};

pub(super) struct Table<S: Clone + Send + Sync + 'static> {
    router: Router<S>,
    paths: Vec<&'static str>,
}

impl<S: Clone + Send + Sync + 'static> Table<S> {
    pub fn new() -> Self {
        Self {
            router: Router::new(),
            paths: Vec::new(),
        }
    }

    pub fn route(mut self, path: &'static str, method_router: MethodRouter<S>) -> Self {
        self.paths.push(path);
        self.router = self.router.route(path, method_router);
        self
    }

    /// `Router::route_layer`: a layer around the routes added so far.
    pub fn route_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<Route> + Clone + Send + 'static,
        L::Service: Service<Request> + Clone + Send + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.router = self.router.route_layer(layer);
        self
    }

    /// Adds `other`'s routes.
    pub fn merge(mut self, other: Table<S>) -> Self {
        self.paths.extend(other.paths);
        self.router = self.router.merge(other.router);
        self
    }

    pub fn into_parts(self) -> (Router<S>, Vec<&'static str>) {
        (self.router, self.paths)
    }
}

/// The table of a server's state.
pub(super) type ServerTable<T> = Table<Shared<T>>;
