//! `ftvm-cluster`: ftvm's hosts as one cluster on etcd, in modules by
//! job, none importing one that imports it back:
//!
//! - [`model`]: the typed records, specs, requests, replies and errors of
//!   the agents' HTTP API (and of the host records in etcd).
//! - [`store`]: every key the cluster keeps in etcd and every read and
//!   transaction on them, behind a trait with an in-memory twin.
//! - [`authority`]: the cluster's certificate authority, each host's and
//!   operator's credentials, the API's token.
//! - [`client`]: the client of an agent's API (`ftvm cluster`'s, and the
//!   control plane's, behind a trait).
//! - [`control`]: the control plane: the desired state, the controller
//!   that makes it real, the operations across agents, the event log.
//! - [`agent`]: `ftvm agent`, the daemon of one host: its API, its VMs as
//!   child processes, its TLS listener, its metrics, its VMs' pair keys.
//! - [`dashboard`]: the web page every agent serves at `/ui`: the
//!   cluster, its pairs and their history, and the operator's actions.
//! - [`console`]: a VM's serial console over the API (a WebSocket), the
//!   agent's side and the client's.
//!
//! Who uses whom: `agent` → `dashboard` → `control` → `client`, `store`,
//! `authority`, `model`; `console` is used by the agent, the dashboard
//! and the command line.

pub mod agent;
pub mod authority;
pub mod client;
pub mod console;
pub mod control;
pub mod dashboard;
pub mod model;
pub mod store;
