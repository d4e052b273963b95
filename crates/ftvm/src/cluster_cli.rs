//! `ftvm agent` and `ftvm cluster`: the command lines of the cluster
//! (`ftvm_cluster`). Parsing and printing only.

use clap::{Args, Subcommand};
use ftvm_api::vm_config::UserConfig;
use ftvm_api::Mode;
use ftvm_cluster::agent::AgentConfig;
use ftvm_cluster::authority::credentials::{self, Credentials};
use ftvm_cluster::control::desired::{self, VmRecord};
use ftvm_cluster::control::ops::{self, Cluster};
use ftvm_cluster::model::{Done, NetworkSpec, VmInfo, VmSpec};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

type CliResult = Result<u32, Box<dyn std::error::Error>>;

/// `ftvm agent`'s options.
#[derive(Args)]
pub struct AgentArgs {
    /// This host's identity in the cluster. Default: the environment's
    /// FTVM_HOST_ID, else the host name.
    #[arg(long, value_name = "ID")]
    host_id: Option<String>,
    /// etcd's endpoints, comma-separated (https://HOST:PORT,...).
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
    /// This host's credentials (`ftvm cluster issue` makes them): the API's
    /// token, the cluster's authority, and the host's certificate, which
    /// the API is served with (HTTPS) and etcd is spoken to with.
    #[arg(long, value_name = "DIR", env = "FTVM_CREDENTIALS")]
    credentials: PathBuf,
    /// The memory this host's VMs may have in all, MiB (the rest is the
    /// host's own). Default: the host's memory.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    vm_memory: Option<u64>,
    /// The guest images this host's VMs boot from (`ftvm image build`
    /// makes them). Default: the cache's (`ftvm image list`).
    #[arg(long, value_name = "DIR")]
    images: Option<PathBuf>,
}

/// `--disk-size`: a size as `ftvm image build --size` takes it (8G,
/// 512M), in MiB, rounded up.
fn disk_size_mib(s: &str) -> Result<u64, String> {
    ftvm_image::parse_size(s).map(|bytes| bytes.div_ceil(1 << 20)).map_err(|e| e.cause)
}

/// `--user NAME[:KEYFILE[:GROUP,...]]`, its key file read (as `ftvm run`'s).
fn seed_user(s: &str) -> Result<UserConfig, String> {
    ftvm_image::seed::parse_user(s).map(UserConfig::from).map_err(|e| e.cause)
}

/// Runs the agent until SIGTERM or SIGINT.
pub fn agent(args: AgentArgs) -> CliResult {
    let credentials = Credentials::read(&args.credentials)?;
    let id = args
        .host_id
        .or_else(|| std::env::var("FTVM_HOST_ID").ok().filter(|s| !s.is_empty()))
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|s| s.trim().to_string()))
        .filter(|s| !s.is_empty())
        .ok_or("no host identity: give --host-id")?;
    let state_dir = std::path::absolute(&args.state_dir)?;
    let config = AgentConfig {
        id,
        etcd: credentials.etcd(&args.etcd)?,
        listen: SocketAddr::new(args.address, args.port),
        address: args.address,
        state_dir,
        credentials,
        ftvm: std::env::current_exe()?,
        images: match args.images {
            Some(dir) => std::path::absolute(dir)?,
            None => ftvm_image::images_dir(),
        },
        vm_memory: args.vm_memory.map(|m| m << 20),
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
    /// The operator's credentials (`ftvm cluster issue` makes them): the
    /// API's token, the cluster's authority and a certificate of its.
    #[arg(long, value_name = "DIR", env = "FTVM_CREDENTIALS", global = true)]
    credentials: Option<PathBuf>,
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
    /// Make a new cluster's authority in DIR: its certificate (ca.pem),
    /// its key (ca.key, which no host needs) and the API's token.
    Init { dir: PathBuf },
    /// Make the credentials of a host or an operator in OUT: a certificate
    /// signed by the authority in CA_DIR (for the host's addresses), its
    /// key, the authority's certificate and the API's token.
    Issue {
        /// The authority's directory (`init`).
        ca_dir: PathBuf,
        /// The credentials' directory (made; mode 0700).
        out: PathBuf,
        /// The host's or operator's name.
        #[arg(long, value_name = "NAME")]
        name: String,
        /// An address the host serves on (its agent's and etcd member's);
        /// repeat for more. None for an operator.
        #[arg(long, value_name = "IP")]
        ip: Vec<IpAddr>,
        /// A DNS name the host serves under; repeat for more.
        #[arg(long, value_name = "NAME")]
        dns: Vec<String>,
    },
    /// The cluster's event log: what happened to its VMs' pairs (protected,
    /// failure declared, gone live, handed over) and what its controller
    /// did, one line each (--json: one JSON object a line).
    Events {
        /// Only this VM's events.
        #[arg(long, value_name = "NAME")]
        vm: Option<String>,
        /// Go on printing events as they come, until interrupted.
        #[arg(long)]
        follow: bool,
    },
}

#[derive(Subcommand)]
enum HostCommand {
    /// Each host: its VMs, memory and agent, and whether it is drained.
    List,
    /// Empty a host for maintenance: its primaries hand over, its backups
    /// move elsewhere, its VMs running alone move; nothing new
    /// is placed there until `undrain`. Waits until it runs no VM.
    Drain {
        host: String,
        /// Seconds to wait for the host to be empty (0: do not wait).
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        wait: u64,
    },
    /// Take a drained host back into use.
    Undrain { host: String },
}

#[derive(Subcommand)]
enum VmCommand {
    /// Each VM of the cluster: its processes with their hosts and parts,
    /// and the VMs that run nowhere (not yet placed, or lost).
    List,
    /// One VM: its record and, on each of its hosts, its part and status.
    Show { name: String },
    /// Add a VM to the cluster: the controller starts it (on --on, else
    /// on the host with the most memory free). Waits until it runs.
    Create {
        name: String,
        /// The host to run it on.
        #[arg(long, value_name = "HOST")]
        on: Option<String>,
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
        /// Keep it protected in this mode (lockstep, epoch or
        /// checkpoint; each host keeps its own copy of the disk):
        /// the controller gives it a backup on another host, and a new
        /// one after a failover.
        #[arg(long, value_name = "MODE", value_parser = crate::pair_cli::choice::<Mode>(Mode::NAMES))]
        protect: Option<Mode>,
        /// The guest image it boots (`ftvm cluster host list` shows each
        /// host's): it starts only on a host that has it. Default: the
        /// default image.
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// Its root disk's size (e.g. 8G), if larger than the image's:
        /// the disk and its filesystem are grown before it first boots.
        #[arg(long, value_name = "SIZE", value_parser = disk_size_mib)]
        disk_size: Option<u64>,
        /// A public key (an OpenSSH `.pub` file, read here) root may log in
        /// with over ssh, in the VM's seed. May be repeated.
        #[arg(long = "ssh-key", value_name = "FILE")]
        ssh_keys: Vec<PathBuf>,
        /// An account the guest makes at its first boot, in the VM's seed:
        /// NAME, the public keys in KEYFILE (read here) it may log in with,
        /// the groups it joins, e.g. `alice:alice.pub:sudo`. May be repeated.
        #[arg(long = "user", value_name = "NAME[:KEYFILE[:GROUP,...]]", value_parser = seed_user)]
        users: Vec<UserConfig>,
        /// Seconds to wait for it to run (0: do not wait).
        #[arg(long, value_name = "SECS", default_value_t = 120)]
        wait: u64,
    },
    /// Keep a VM protected from now on; with --on, give it its backup on
    /// that host now (else the controller chooses).
    Protect {
        name: String,
        /// The backup's host.
        #[arg(long, value_name = "HOST")]
        on: Option<String>,
        /// The mode: lockstep, epoch or checkpoint (each host keeps its
        /// own copy of the disk). Default: the one its record keeps it
        /// protected in, else checkpoint.
        #[arg(long, value_parser = crate::pair_cli::choice::<Mode>(Mode::NAMES))]
        mode: Option<Mode>,
    },
    /// Stop protecting a VM (its backup stops; it runs on alone).
    Unprotect { name: String },
    /// Hand a VM over to its backup on purpose.
    Handover { name: String },
    /// Move a VM to another host while it runs: a backup there, then a
    /// handover to it (its protection is restored afterwards).
    Move {
        name: String,
        /// The host it is to run on.
        #[arg(long, value_name = "HOST")]
        to: String,
    },
    /// Attach this terminal to a VM's serial console on its live side
    /// (its primary, or the VM itself if unprotected), through that host's
    /// agent: its recent output first, then what it shows; what you type
    /// goes to the VM (one client types at a time, any number watch).
    /// Ctrl-] detaches. Piped input is typed, and its end detaches.
    Console {
        name: String,
        /// Watch only: nothing typed here reaches the VM.
        #[arg(long)]
        read_only: bool,
    },
    /// Remove a VM from the cluster: it stops on every host (a protected
    /// primary hands over first; its backup's side is stopped too).
    Delete { name: String },
}

fn need<'a, T>(v: &'a Option<T>, what: &str) -> Result<&'a T, String> {
    v.as_ref().ok_or_else(|| format!("give {what}"))
}

/// A process's state, in a word or a status line.
fn state_of(v: &VmInfo) -> String {
    v.status.as_ref().map_or_else(|| v.ended.clone().unwrap_or_default(), |s| s.to_string())
}

/// Runs one `ftvm cluster` command.
pub fn cluster(args: ClusterArgs) -> CliResult {
    match &args.command {
        ClusterCommand::Init { dir } => {
            credentials::init(dir)?;
            println!("{}", dir.display());
            return Ok(0);
        }
        ClusterCommand::Issue { ca_dir, out, name, ip, dns } => {
            let subject = credentials::Subject { name: name.clone(), ips: ip.clone(), dns: dns.clone() };
            credentials::issue(ca_dir, out, &subject)?;
            println!("{}", out.display());
            return Ok(0);
        }
        _ => {}
    }
    let etcd = need(&args.etcd, "--etcd URLS (or FTVM_ETCD)")?;
    let credentials = Credentials::read(need(&args.credentials, "--credentials DIR (or FTVM_CREDENTIALS)")?)?;
    let cluster = Cluster::new(credentials.etcd(etcd)?, &credentials)?;
    if let ClusterCommand::Vm(VmCommand::Console { name, read_only }) = &args.command {
        // The live side's host, as the hosts' records say, and its agent's
        // WebSocket as a socket this terminal's loop reads and writes.
        let opened = ftvm_cluster::console::open_blocking(cluster.hosts()?, credentials, name.clone(), *read_only);
        // No host runs it: its record says whether the cluster has it.
        if let Err(ftvm_cluster::console::ConsoleError::NoVm(_)) = &opened {
            if let Some(record) = desired::get(cluster.store(), name)? {
                let why = record.problem.unwrap_or_else(|| "not started yet".into());
                return Err(format!("VM {name} runs on no host now ({why}): it has no console").into());
            }
        }
        let (conn, attached) = opened?;
        let what = format!("the console of VM {} on {}", attached.vm, attached.host);
        return crate::console_cli::session(conn, attached.typing, &what);
    }
    let json = args.json;
    let print_json = |v: &dyn erased::Json| println!("{}", v.json());
    let print_done = |done: &Done| if json { print_json(done) } else { println!("{}", done.message) };
    match args.command {
        ClusterCommand::Init { .. } | ClusterCommand::Issue { .. } => unreachable!("answered above"),
        ClusterCommand::Vm(VmCommand::Console { .. }) => unreachable!("answered above"),
        ClusterCommand::Host(HostCommand::List) => {
            let hosts = cluster.hosts()?;
            let drained = desired::drained(cluster.store())?;
            if json {
                print_json(&hosts);
            } else {
                println!(
                    "{:<16} {:<22} {:>5} {:>10} {:>10}  {:<24} VMS",
                    "HOST", "API", "CORES", "MEMORY", "FREE", "IMAGES"
                );
                for h in &hosts {
                    let mut vms: Vec<String> = h.vms.iter().map(|v| format!("{}:{}", v.name, v.role.word())).collect();
                    if drained.contains(&h.id) {
                        vms.insert(0, "(drained)".into());
                    }
                    let images: Vec<&str> = h.images.iter().map(|i| i.name.as_str()).collect();
                    println!(
                        "{:<16} {:<22} {:>5} {:>9}M {:>9}M  {:<24} {}",
                        h.id,
                        h.api,
                        h.cores,
                        h.memory_bytes >> 20,
                        h.free_memory_bytes >> 20,
                        if images.is_empty() { "-".to_string() } else { images.join(",") },
                        vms.join(" ")
                    );
                }
            }
        }
        ClusterCommand::Host(HostCommand::Drain { host, wait }) => {
            cluster.drain(&host, true)?;
            if wait > 0 {
                cluster.wait_drained(&host, Duration::from_secs(wait))?;
                print_done(&Done { message: format!("host {host} is drained: it runs no VM") });
            } else {
                print_done(&Done { message: format!("host {host} is being drained") });
            }
        }
        ClusterCommand::Host(HostCommand::Undrain { host }) => {
            cluster.drain(&host, false)?;
            print_done(&Done { message: format!("host {host} takes VMs again") });
        }
        ClusterCommand::Vm(VmCommand::List) => {
            let hosts = cluster.hosts()?;
            let mut rows = Vec::new();
            for (host, vms) in cluster.processes(&hosts) {
                match vms {
                    Ok(vms) => rows.extend(vms),
                    Err(e) => eprintln!("ftvm: host {}: {e}", host.id),
                }
            }
            let records = desired::all(cluster.store())?;
            let nowhere: Vec<&VmRecord> =
                records.iter().filter(|r| !rows.iter().any(|v| v.name == r.spec.name)).collect();
            if json {
                print_json(&rows);
            } else {
                println!("{:<20} {:<16} {:<12} {:<10} STATE", "VM", "HOST", "ROLE", "MODE");
                for v in &rows {
                    let mode = v.mode();
                    println!("{:<20} {:<16} {:<12} {:<10} {}", v.name, v.host, v.role.word(), mode, state_of(v));
                }
                for r in nowhere {
                    let why = r.problem.clone().unwrap_or_else(|| "not started yet".into());
                    println!("{:<20} {:<16} {:<12} {:<10} {}", r.spec.name, "-", "-", "-", why);
                }
            }
        }
        ClusterCommand::Vm(VmCommand::Show { name }) => {
            let record = desired::get(cluster.store(), &name)?;
            let sides: Vec<VmInfo> = match cluster.find(&cluster.hosts()?, &name) {
                Ok((running, backup)) => std::iter::once(running.info).chain(backup.map(|b| b.info)).collect(),
                Err(ops::OpsError::NoVm(_)) if record.is_some() => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            if json {
                print_json(&sides);
            } else {
                if let Some(r) = &record {
                    let protect = r.spec.protect.map_or("none", Mode::name);
                    println!("{name}: wanted protection {protect}; {:?}", r.phase);
                    if let Some(p) = &r.problem {
                        println!("  problem: {p}");
                    }
                }
                for v in &sides {
                    println!("{} on {} ({}): {}", v.name, v.host, v.role.word(), state_of(v));
                }
            }
        }
        ClusterCommand::Vm(VmCommand::Create {
            name,
            on,
            memory,
            cpus,
            command,
            bridge,
            ip,
            protect,
            image,
            disk_size,
            ssh_keys,
            users,
            wait,
        }) => {
            let network = bridge.zip(ip).map(|(bridge, ip)| NetworkSpec { bridge, ip });
            let spec = VmSpec {
                name: name.clone(),
                memory_mib: memory,
                cpus,
                command,
                network,
                protect,
                image,
                disk_mib: disk_size,
                ssh_keys: ftvm_image::seed::read_public_keys(&ssh_keys)?,
                users,
            };
            cluster.create(spec, on.as_deref())?;
            if wait == 0 {
                print_done(&Done { message: format!("{name} added to the cluster: the controller starts it") });
            } else {
                let side = cluster.wait_running(&name, Duration::from_secs(wait))?;
                if json {
                    print_json(&side.info);
                } else {
                    println!("{} created on {} (pid {})", name, side.host.id, side.info.pid.unwrap_or(0));
                }
            }
        }
        ClusterCommand::Vm(VmCommand::Protect { name, on, mode }) => {
            let mode = match mode {
                Some(mode) => mode,
                None => cluster.protection_mode(&name)?,
            };
            print_done(&cluster.protect(&name, on.as_deref(), mode)?);
        }
        ClusterCommand::Vm(VmCommand::Unprotect { name }) => print_done(&cluster.unprotect(&name)?),
        ClusterCommand::Vm(VmCommand::Handover { name }) => print_done(&cluster.handover(&name)?),
        ClusterCommand::Vm(VmCommand::Move { name, to }) => print_done(&cluster.move_to(&name, &to)?),
        ClusterCommand::Events { vm, follow } => {
            let mut cursor = ftvm_cluster::control::events::Cursor { after: 0, vm };
            loop {
                for e in cursor.next(cluster.store())? {
                    if json {
                        println!("{}", serde_json::to_string(&e).expect("an event serializes"));
                    } else {
                        println!("{e}");
                    }
                }
                if !follow {
                    break;
                }
                std::thread::sleep(ftvm_cluster::control::events::POLL);
            }
        }
        ClusterCommand::Vm(VmCommand::Delete { name }) => {
            let deleted = cluster.delete(&name)?;
            if json {
                print_json(&deleted);
            } else if deleted.is_empty() {
                println!("{name} removed from the cluster (it ran nowhere)");
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
