//! `ftvm-cluster`: ftvm's hosts as one cluster on etcd.
//!
//! - [`model`]: the typed records, specs, requests, replies and errors of
//!   the agents' HTTP API (and of the host records in etcd).
//! - [`agent`]: `ftvm agent`, the daemon of one host: its VMs, its record
//!   in etcd, its API and metrics.
//! - [`controller`]: one agent at a time keeps the VMs protected.
//! - [`vms`]: a host's VMs as child processes, spoken to through their
//!   control sockets.
//! - [`metrics`]: the Prometheus metrics of a host and its VMs.
//! - [`keys`]: each VM's pair key, shared by its hosts through etcd.
//! - [`session`]: connections to etcd, and leases held by a loop.
//! - [`token`]: the API's bearer token.
//! - [`refusal`]: every refusal of the API as the model's JSON error.
//! - [`client`]: `ftvm cluster`'s client of an agent's API.
//! - [`ops`]: operations across agents (protect a VM on another host).

pub mod agent;
pub mod client;
pub mod controller;
pub mod keys;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod refusal;
pub mod session;
pub mod token;
pub mod vms;
