//! `ftvm agent` and `ftvm cluster`: the command lines of the cluster
//! (`ftvm_cluster`). Parsing and printing only.

use clap::{Args, Subcommand};
use ftvm_cluster::agent::AgentConfig;
use ftvm_cluster::client::AgentClient;
use ftvm_cluster::model::{NetworkSpec, VmSpec};
use ftvm_cluster::ops;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

type CliResult = Result<u32, Box<dyn std::error::Error>>;

/// `ftvm agent`'s options.
#[derive(Args)]
pub struct AgentArgs {
    /// This host's identity in the cluster. Default: the environment's
    /// FTVM_HOST_ID, else the host name.
    #[arg(long, value_name = "ID")]
    host_id: Option<String>,
    /// etcd's endpoints, comma-separated (http://HOST:PORT,...).
    #[arg(long, value_name = "URLS", env = "FTVM_ETCD")]
    etcd: String,
    /// This host's address on the cluster's network: the API listens
    /// there (--port), and backups of VMs listen there too.
    #[arg(long, value_name = "IP")]
    address: IpAddr,
    /// The API's port.
    #[arg(long, value_name = "PORT", default_value_t = 7800, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// The agent's files (VM directories, pair keys).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/ftvm")]
    state_dir: PathBuf,
    /// The cluster's API token (a file, mode 0600: `ftvm cluster token FILE` makes one).
    #[arg(long, value_name = "FILE", env = "FTVM_TOKEN_FILE")]
    token_file: PathBuf,
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn agent(args: AgentArgs) -> CliResult {
    let token = ftvm_cluster::token::read(&args.token_file)?;
    let id = args
        .host_id
        .or_else(|| std::env::var("FTVM_HOST_ID").ok().filter(|s| !s.is_empty()))
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|s| s.trim().to_string()))
        .filter(|s| !s.is_empty())
        .ok_or("no host identity: give --host-id")?;
    let state_dir = std::path::absolute(&args.state_dir)?;
    let config = AgentConfig {
        id,
        etcd: args.etcd,
        listen: SocketAddr::new(args.address, args.port),
        address: args.address,
        state_dir,
        token,
        ftvm: std::env::current_exe()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(ftvm_cluster::agent::run(config))?;
    Ok(0)
}

/// `ftvm cluster`'s options.
#[derive(Args)]
pub struct ClusterArgs {
    /// etcd's endpoints, comma-separated: the hosts are found there.
    #[arg(long, value_name = "URLS", env = "FTVM_ETCD", global = true)]
    etcd: Option<String>,
    /// The cluster's API token.
    #[arg(long, value_name = "FILE", env = "FTVM_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// Print JSON instead of the readable form.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// The cluster's hosts.
    #[command(subcommand)]
    Host(HostCommand),
    /// The cluster's VMs.
    #[command(subcommand)]
    Vm(VmCommand),
    /// Write a new random API token to FILE (mode 0600), for every agent
    /// and client of the cluster.
    Token { file: PathBuf },
}

#[derive(Subcommand)]
enum HostCommand {
    /// Each host: its VMs, memory and agent.
    List,
}

#[derive(Subcommand)]
enum VmCommand {
    /// Each VM process of the cluster, with its host and part.
    List,
    /// One VM: its spec, part and status on each of its hosts.
    Show { name: String },
    /// Start a VM on a host.
    Create {
        name: String,
        /// The host to run it on.
        #[arg(long, value_name = "HOST")]
        on: String,
        /// Guest memory, MiB.
        #[arg(long, value_name = "MIB", default_value_t = 512)]
        memory: u64,
        /// Harts.
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// The command the guest runs once booted.
        #[arg(long, value_name = "CMD")]
        command: Option<String>,
        /// The host bridge for the VM's NIC (with --ip).
        #[arg(long, value_name = "BRIDGE", requires = "ip")]
        bridge: Option<String>,
        /// The guest's address, IPv4/LEN (with --bridge).
        #[arg(long, value_name = "IP/LEN", requires = "bridge")]
        ip: Option<String>,
        /// Keep it protected in this mode (checkpoint: the one that
        /// protects a running VM on each host's own disk):
        /// the controller gives it a backup on another host, and a new
        /// one after a failover.
        #[arg(long, value_name = "MODE")]
        protect: Option<String>,
    },
    /// Give a VM a backup on another host.
    Protect {
        name: String,
        /// The backup's host.
        #[arg(long, value_name = "HOST")]
        on: String,
        /// lockstep, epoch or checkpoint.
        #[arg(long, default_value = "lockstep")]
        mode: String,
    },
    /// Stop protecting a VM (its backup stops; it runs on alone).
    Unprotect { name: String },
    /// Hand a VM over to its backup on purpose.
    Handover { name: String },
    /// Stop a VM on every host (a protected primary hands over first:
    /// delete the backup's side too).
    Delete { name: String },
}

fn need<'a, T>(v: &'a Option<T>, what: &str) -> Result<&'a T, String> {
    v.as_ref().ok_or_else(|| format!("give {what}"))
}

/// Runs one `ftvm cluster` command.
pub fn cluster(args: ClusterArgs) -> CliResult {
    if let ClusterCommand::Token { file } = &args.command {
        ftvm_cluster::token::create(file)?;
        println!("{}", file.display());
        return Ok(0);
    }
    let etcd = need(&args.etcd, "--etcd URLS (or FTVM_ETCD)")?;
    let token = ftvm_cluster::token::read(need(&args.token_file, "--token-file FILE (or FTVM_TOKEN_FILE)")?)?;
    let json = args.json;
    let print_json = |v: &dyn erased::Json| println!("{}", v.json());
    match args.command {
        ClusterCommand::Token { .. } => unreachable!("answered above"),
        ClusterCommand::Host(HostCommand::List) => {
            let hosts = ops::hosts(etcd)?;
            if json {
                print_json(&hosts);
            } else {
                println!("{:<16} {:<22} {:>5} {:>10} {:>10}  VMS", "HOST", "API", "CORES", "MEMORY", "FREE");
                for h in &hosts {
                    let vms: Vec<String> = h.vms.iter().map(|v| format!("{}:{}", v.name, v.role.word())).collect();
                    println!(
                        "{:<16} {:<22} {:>5} {:>9}M {:>9}M  {}",
                        h.id,
                        h.api,
                        h.cores,
                        h.memory_bytes >> 20,
                        h.free_memory_bytes >> 20,
                        vms.join(" ")
                    );
                }
            }
        }
        ClusterCommand::Vm(VmCommand::List) => {
            let hosts = ops::hosts(etcd)?;
            let mut rows = Vec::new();
            for (host, vms) in ops::vms(&hosts, &token) {
                match vms {
                    Ok(vms) => rows.extend(vms),
                    Err(e) => eprintln!("ftvm: host {}: {e}", host.id),
                }
            }
            if json {
                print_json(&rows);
            } else {
                println!("{:<20} {:<16} {:<12} {:<10} STATE", "VM", "HOST", "ROLE", "MODE");
                for v in &rows {
                    let state =
                        v.status.as_ref().map_or_else(|| v.ended.clone().unwrap_or_default(), |s| s.to_string());
                    let mode = ftvm_cluster::metrics::mode_of(v);
                    println!("{:<20} {:<16} {:<12} {:<10} {}", v.name, v.host, v.role.word(), mode, state);
                }
            }
        }
        ClusterCommand::Vm(VmCommand::Show { name }) => {
            let hosts = ops::hosts(etcd)?;
            let (running, backup) = ops::find(&hosts, &token, &name)?;
            let sides: Vec<_> = std::iter::once(running.info).chain(backup.map(|b| b.info)).collect();
            if json {
                print_json(&sides);
            } else {
                for v in &sides {
                    let state =
                        v.status.as_ref().map_or_else(|| v.ended.clone().unwrap_or_default(), |s| s.to_string());
                    println!("{} on {} ({}): {}", v.name, v.host, v.role.word(), state);
                }
            }
        }
        ClusterCommand::Vm(VmCommand::Create { name, on, memory, cpus, command, bridge, ip, protect }) => {
            let hosts = ops::hosts(etcd)?;
            let host = hosts.iter().find(|h| h.id == on).ok_or_else(|| ops::OpsError::NoHost(on.clone()))?;
            let network = bridge.zip(ip).map(|(bridge, ip)| NetworkSpec { bridge, ip });
            let spec = VmSpec { name, memory_mib: memory, cpus, command, network, protect };
            let info = AgentClient::new(&host.api, &token).create(&spec)?;
            if json {
                print_json(&info);
            } else {
                println!("{} created on {} (pid {})", info.name, info.host, info.pid.unwrap_or(0));
            }
        }
        ClusterCommand::Vm(VmCommand::Protect { name, on, mode }) => {
            let done = ops::protect(etcd, &token, &name, &on, &mode)?;
            if json {
                print_json(&done);
            } else {
                println!("{}", done.message);
            }
        }
        ClusterCommand::Vm(cmd @ (VmCommand::Unprotect { .. } | VmCommand::Handover { .. })) => {
            let hosts = ops::hosts(etcd)?;
            let (name, handover) = match &cmd {
                VmCommand::Unprotect { name } => (name.clone(), false),
                VmCommand::Handover { name } => (name.clone(), true),
                _ => unreachable!("matched above"),
            };
            let (running, _) = ops::find(&hosts, &token, &name)?;
            let client = AgentClient::new(&running.host.api, &token);
            let done = if handover { client.handover(&name)? } else { client.unprotect(&name)? };
            if json {
                print_json(&done);
            } else {
                println!("{}", done.message);
            }
        }
        ClusterCommand::Vm(VmCommand::Delete { name }) => {
            let hosts = ops::hosts(etcd)?;
            let mut deleted = Vec::new();
            for h in hosts.iter().filter(|h| h.vms.iter().any(|v| v.name == name)) {
                let done = AgentClient::new(&h.api, &token).delete(&name)?;
                deleted.push(done);
            }
            if deleted.is_empty() {
                return Err(ops::OpsError::NoVm(name).into());
            }
            if json {
                print_json(&deleted);
            } else {
                for d in &deleted {
                    println!("{}", d.message);
                }
            }
        }
    }
    Ok(0)
}

/// Anything the command line prints as JSON.
mod erased {
    pub trait Json {
        fn json(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string_pretty(self).expect("the API's types serialize")
        }
    }
}
