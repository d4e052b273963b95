//! `ftvm-cluster`: ftvm's hosts as one cluster on etcd.
//!
//! - [`model`]: the typed records, specs, requests, replies and errors of
//!   the agents' HTTP API (and of the host records in etcd).
//! - [`agent`]: `ftvm agent`, the daemon of one host: its VMs, its record
//!   in etcd, its API and metrics.
//! - [`desired`]: the cluster's desired state in etcd: each VM's record
//!   (its spec and wanted protection), the drained hosts.
//! - [`controller`]: one agent at a time makes the cluster match it:
//!   places VMs, keeps them protected, empties drained hosts.
//! - [`vms`]: a host's VMs as child processes, spoken to through their
//!   control sockets.
//! - [`events`]: the cluster's event log in etcd (the pairs' events and
//!   the controller's actions), read by the API's event stream.
//! - [`dashboard`]: the web page every agent serves at `/ui`: the
//!   cluster, its pairs and their history, and the operator's actions.
//! - [`metrics`]: the Prometheus metrics of a host and its VMs.
//! - [`keys`]: each VM's pair key, shared by its hosts through etcd.
//! - [`store`]: every key the cluster keeps in etcd, and every read and
//!   transaction on them, behind a trait with an in-memory twin.
//! - [`token`]: the API's bearer token.
//! - [`credentials`]: the cluster's authority, each host's and operator's
//!   credentials, and the TLS made of them.
//! - [`https`]: the agent's HTTPS listener.
//! - [`refusal`]: every refusal of the API as the model's JSON error.
//! - [`client`]: `ftvm cluster`'s client of an agent's API.
//! - [`console`]: a VM's serial console over the API (a WebSocket), the
//!   agent's side and the client's.
//! - [`ops`]: operations across agents (create, protect a VM on another
//!   host, move, drain).

pub mod agent;
pub mod client;
pub mod console;
pub mod controller;
pub mod credentials;
pub mod dashboard;
pub mod desired;
pub mod events;
#[cfg(test)]
mod fake_hosts;
pub mod https;
pub mod keys;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod refusal;
pub mod store;
pub mod token;
pub mod vms;
