// The dashboard's script: it puts what the agent's feed (/ui/stream,
// server-sent events) sends in its place (the server renders every piece
// of HTML), and sends the operator's actions after a confirmation. No
// library, nothing fetched from elsewhere.
"use strict";

const csrf = document.querySelector("meta[name=ftvm-csrf]").content;
const $ = (id) => document.getElementById(id);
const KEEP_ROWS = 500;

function live(ok, text) {
  const l = $("live");
  l.className = ok ? "fresh" : "stale";
  l.textContent = text;
}

function connect() {
  const feed = new EventSource("/ui/stream");
  feed.onopen = () => live(true, "live");
  feed.onerror = () => live(false, "reconnecting…");
  feed.addEventListener("view", (m) => {
    $("view").innerHTML = m.data;
  });
  feed.addEventListener("jobs", (m) => {
    $("jobs").innerHTML = m.data;
  });
  feed.addEventListener("event", (m) => {
    const body = $("events");
    // Newest first.
    body.insertAdjacentHTML("afterbegin", m.data);
    while (body.rows.length > KEEP_ROWS) body.deleteRow(body.rows.length - 1);
  });
}

// The action waiting for its confirmation.
let pending = null;

const needsHost = { protect: true, move_backup: true, move: true };
const sentence = {
  protect: (a) => `Protect ${a.vm}` + (a.host ? ` with a backup on` : ""),
  handover: (a) => `Hand ${a.vm} over to its backup now?`,
  move_backup: (a) => `Move ${a.vm}'s backup to`,
  move: (a) => `Move ${a.vm} (the guest runs on) to`,
  drain: (a) => `Drain host ${a.host}: move every VM off it?`,
  undrain: (a) => `Take host ${a.host} back into use?`,
};

function ask(button) {
  const a = { action: button.dataset.action, vm: button.dataset.vm, host: button.dataset.host };
  const select = $("confirm-host");
  select.replaceChildren();
  if (needsHost[a.action]) {
    const hosts = a.host ? a.host.split(",") : [];
    if (a.action === "protect") select.add(new Option("(the controller chooses)", ""));
    for (const h of hosts) select.add(new Option(h, h));
    select.hidden = false;
  } else {
    select.hidden = true;
  }
  $("confirm-text").textContent = sentence[a.action] ? sentence[a.action](a) : a.action;
  pending = a;
  $("confirm").hidden = false;
  $("confirm-yes").focus();
}

async function send(a) {
  const body = { action: a.action };
  if (a.vm) body.vm = a.vm;
  if (needsHost[a.action]) {
    body.host = $("confirm-host").value;
  } else if (a.host) {
    body.host = a.host;
  }
  post(body);
}

// An action to the agent; a refusal shown above the jobs.
async function post(body) {
  try {
    const r = await fetch("/ui/actions", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Ftvm-Csrf": csrf },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    if (!r.ok) {
      const e = await r.json().catch(() => ({ message: r.statusText }));
      refused(e.message || r.statusText);
    }
  } catch (e) {
    refused(String(e));
  }
}

function refused(message) {
  const li = document.createElement("p");
  li.className = "job bad";
  li.textContent = "refused: " + message;
  $("jobs").prepend(li);
}

// A VM's console: a WebSocket to this agent (/ui/console/NAME), which
// relays it to the VM's live side. Its first message is the page's CSRF
// value; the agent's first answer says whether this page types. What the
// VM shows is put in the <pre> as text (never as HTML), its terminal
// control sequences left out; the last KEEP_CONSOLE characters are kept.
const KEEP_CONSOLE = 64 * 1024;
let consoleSocket = null;

function consoleState(text) {
  $("console-state").textContent = text;
}

function showConsole(text) {
  const plain = text
    .replace(/\x1b\[[0-9;?]*[ -\/]*[@-~]/g, "") // CSI: colours, cursor moves, modes
    .replace(/\x1b\][^\x07\x1b]*(\x07|\x1b\\)?/g, "") // OSC: a terminal's title
    .replace(/\x1b./g, "")
    .replace(/\r/g, "");
  const out = $("console-out");
  out.textContent = (out.textContent + plain).slice(-KEEP_CONSOLE);
  out.scrollTop = out.scrollHeight;
}

function openConsole(vm) {
  closeConsole();
  $("console").hidden = false;
  $("console-vm").textContent = vm;
  $("console-out").textContent = "";
  $("console-in").disabled = true;
  consoleState("connecting…");
  const socket = new WebSocket(`wss://${location.host}/ui/console/${encodeURIComponent(vm)}`);
  socket.binaryType = "arraybuffer";
  const decoder = new TextDecoder();
  socket.onopen = () => socket.send(csrf);
  socket.onmessage = (m) => {
    if (typeof m.data !== "string") {
      showConsole(decoder.decode(m.data, { stream: true }));
      return;
    }
    const said = JSON.parse(m.data);
    if (said.error) {
      consoleState("refused: " + said.error);
    } else {
      consoleState(`on ${said.host}, ` + (said.typing ? "typing" : "watching (another client types)"));
      $("console-in").disabled = !said.typing;
      if (said.typing) $("console-in").focus();
    }
  };
  socket.onclose = (e) => {
    if (consoleSocket !== socket) return;
    $("console-in").disabled = true;
    if (!$("console-state").textContent.startsWith("refused")) consoleState("closed" + (e.reason ? ": " + e.reason : ""));
  };
  consoleSocket = socket;
}

function closeConsole() {
  if (consoleSocket) consoleSocket.close();
  consoleSocket = null;
  $("console").hidden = true;
}

$("console-in").addEventListener("keydown", (ev) => {
  if (ev.key !== "Enter" || !consoleSocket || consoleSocket.readyState !== WebSocket.OPEN) return;
  ev.preventDefault();
  consoleSocket.send(new TextEncoder().encode(ev.target.value + "\r"));
  ev.target.value = "";
});

// The new VM's form: its image and host choices are what the hosts' rows
// say now (each host's images; the hosts up and not drained), the
// controller's choice of host first.
function openCreate() {
  const images = new Set();
  const hosts = [];
  for (const row of document.querySelectorAll("#hosts tr[data-host]")) {
    for (const i of row.dataset.images.split(",")) if (i) images.add(i);
    if (row.dataset.up === "true") hosts.push(row.dataset.host);
  }
  const image = $("create-image");
  image.replaceChildren();
  for (const i of [...images].sort()) image.add(new Option(i, i));
  const host = $("create-host");
  host.replaceChildren(new Option("(the controller chooses)", ""));
  for (const h of hosts) host.add(new Option(h, h));
  $("create").hidden = false;
  $("create-form").elements.name.focus();
}

$("create-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const f = ev.target.elements;
  const spec = {
    name: f.name.value,
    memory_mib: Number(f.memory_mib.value),
    cpus: Number(f.cpus.value),
  };
  if (f.image.value) spec.image = f.image.value;
  if (f.disk_mib.value) spec.disk_mib = Number(f.disk_mib.value);
  if (f.protect.value) spec.protect = f.protect.value;
  if (f.bridge.value || f.ip.value) spec.network = { bridge: f.bridge.value, ip: f.ip.value };
  if (f.command.value) spec.command = f.command.value;
  const keys = f.ssh_keys.value.split("\n").map((l) => l.trim()).filter((l) => l);
  if (keys.length) spec.ssh_keys = keys;
  $("create").hidden = true;
  post({ action: "create", spec, host: f.host.value });
});

document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button");
  if (!b) return;
  if (b.classList.contains("console-open")) {
    openConsole(b.dataset.vm);
  } else if (b.id === "console-close") {
    closeConsole();
  } else if (b.classList.contains("action")) {
    ask(b);
  } else if (b.id === "confirm-yes" && pending) {
    const a = pending;
    pending = null;
    $("confirm").hidden = true;
    send(a);
  } else if (b.id === "confirm-no") {
    pending = null;
    $("confirm").hidden = true;
  } else if (b.id === "create-open") {
    openCreate();
  } else if (b.id === "create-no") {
    $("create").hidden = true;
  } else if (b.id === "logout") {
    fetch("/ui/logout", { method: "POST", headers: { "X-Ftvm-Csrf": csrf } }).finally(() => location.reload());
  }
});

connect();
