//! A real BIRD 2 (Debian's `bird2`) in one of the lab's network
//! namespaces: its own config, control socket and log files in a private
//! temporary directory, stopped (and its files removed) when the guard
//! drops, also when the run fails. Run by `observer lab`'s BGP scenarios,
//! and by the BGP tests.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};

use super::shell::run_tool;

/// One node of an iBGP full mesh (AS 64512, Calico's default), with
/// timers short enough for a test: hold 6 s, keepalive 2 s, connect retry
/// 1 s. The peers share a link (`direct`), so a learnt route's next hop
/// is the announcing node itself (`gateway direct`), as on a Calico node
/// peering in its own subnet.
#[derive(Debug, Clone)]
pub struct MeshNode {
    /// Router id and BGP source address.
    pub address: Ipv4Addr,
    /// The pod block this node announces (a blackhole route, as Calico
    /// installs for its own blocks), e.g. `10.65.1.0/26`.
    pub block: String,
    /// The other nodes' addresses.
    pub peers: Vec<Ipv4Addr>,
    /// Blocks this node's import filter rejects (a peer that filters a
    /// new node's block); empty: import all.
    pub rejects: Vec<String>,
    /// The tunnel device learned routes go through, as in Calico's IPIP
    /// mode (`10.65.2.0/26 via 10.99.0.2 dev tunl0 proto bird onlink`);
    /// `None`: direct routing (`via 10.99.0.2 dev eth0`).
    pub tunnel: Option<String>,
}

impl MeshNode {
    /// BIRD's name of the session with `peer`, as Calico names its mesh
    /// sessions: `Mesh_10_99_0_2`.
    pub fn protocol_name(peer: Ipv4Addr) -> String {
        format!("Mesh_{}", peer.to_string().replace('.', "_"))
    }

    /// The BIRD configuration: learned routes go to the kernel with
    /// `proto bird` (through [`MeshNode::tunnel`] when set), and so does
    /// the node's own block as a blackhole (as Calico installs it); the
    /// block is announced to every peer.
    pub fn config(&self, log: &Path) -> String {
        // Calico's BIRD has its own attribute for the tunnel (krt_tunnel);
        // Debian's sets the device and keeps the next hop, onlink.
        let (filter, export) = match &self.tunnel {
            None => (String::new(), "all"),
            Some(device) => (
                format!(
                    "filter to_kernel\nip nh;\n{{\n  if source = RTS_BGP then {{ nh = gw; onlink = true; ifname = \"{device}\"; gw = nh; }}\n  accept;\n}}\n"
                ),
                "filter to_kernel",
            ),
        };
        let mut text = format!(
            "router id {address};\n\
             log \"{log}\" all;\n\
             protocol device {{ scan time 2; }}\n\
             {filter}\
             protocol kernel {{ ipv4 {{ import none; export {export}; }}; }}\n\
             protocol static blocks {{ ipv4; route {block} blackhole; }}\n\
             template bgp mesh {{\n  local as 64512; direct;\n  \
             ipv4 {{ import {import}; export where proto = \"blocks\"; gateway direct; }};\n  \
             hold time 6; keepalive time 2; connect retry time 1; error wait time 1, 2;\n}}\n",
            address = self.address,
            log = log.display(),
            block = self.block,
            import = if self.rejects.is_empty() {
                "all".to_string()
            } else {
                format!("where net !~ [ {} ]", self.rejects.join(", "))
            },
        );
        for peer in &self.peers {
            text.push_str(&format!(
                "protocol bgp {} from mesh {{ neighbor {peer} as 64512; source address {}; }}\n",
                Self::protocol_name(*peer),
                self.address
            ));
        }
        text
    }
}

/// A BIRD daemon running in a namespace, in the foreground as a child of
/// the test (so that it is reaped, and killed if the test dies first).
pub struct Bird {
    namespace: String,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    child: Mutex<Option<Child>>,
    /// Holds the three files above; removed after the daemon is stopped
    /// (fields drop after `Drop::drop`).
    _dir: tempfile::TempDir,
}

impl Bird {
    /// Writes `node`'s config and starts BIRD in the network namespace
    /// named `namespace`; returns once its control socket answers.
    pub fn start_in(namespace: &str, node: &MeshNode) -> Result<Bird> {
        // A private directory (random name, created exclusively, mode
        // 0700) rather than names in /tmp: `observer lab` runs as root, and
        // a name others can predict in a shared directory lets them plant a
        // symlink root writes through.
        let dir = tempfile::Builder::new()
            .prefix("observer-bird-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| anyhow!("creating a directory for BIRD's files: {e}"))?;
        let bird = Bird {
            namespace: namespace.to_string(),
            config: dir.path().join("bird.conf"),
            socket: dir.path().join("bird.ctl"),
            log: dir.path().join("bird.log"),
            child: Mutex::new(None),
            _dir: dir,
        };
        std::fs::write(&bird.config, node.config(&bird.log))
            .map_err(|e| anyhow!("writing {}: {e}", bird.config.display()))?;
        bird.restart()?;
        Ok(bird)
    }

    /// Starts the daemon (again) with its config and socket; returns once
    /// the control socket answers.
    pub fn restart(&self) -> Result<()> {
        let (config, socket) = (
            self.config.display().to_string(),
            self.socket.display().to_string(),
        );
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.namespace,
                "bird",
                "-f",
                "-c",
                &config,
                "-s",
                &socket,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow!("cannot run bird: {e}"))?;
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.birdc(&["show", "status"]).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "BIRD in {} did not answer on {socket} within 10s (log: {})",
            self.namespace,
            self.log.display()
        )
    }

    /// Writes `node`'s config and makes the running daemon take it
    /// (`birdc configure`): protocols gone from it are shut down, as when
    /// Calico removes a node from the mesh.
    pub fn reconfigure(&self, node: &MeshNode) -> Result<()> {
        std::fs::write(&self.config, node.config(&self.log))
            .map_err(|e| anyhow!("writing {}: {e}", self.config.display()))?;
        let reply = self.birdc(&["configure"])?;
        if !reply.contains("Reconfigured") && !reply.contains("Reconfiguration in progress") {
            bail!("birdc configure: {}", reply.trim());
        }
        Ok(())
    }

    /// The control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Runs `birdc -s SOCKET ARGS...`; its output.
    pub fn birdc(&self, args: &[&str]) -> Result<String> {
        let socket = self.socket.display().to_string();
        let mut all = vec!["-s", socket.as_str()];
        all.extend_from_slice(args);
        run_tool("birdc", &all)
    }

    /// Stops the daemon (`birdc down`: a graceful shutdown, so its peers
    /// get a NOTIFICATION) and waits until it has exited; killed if it
    /// has not within 10 s.
    pub fn stop(&self) {
        let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let _ = self.birdc(&["down"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        self.stop();
    }
}
