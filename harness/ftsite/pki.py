"""The cluster's credentials on a test site, made by ftvm itself (`ftvm
cluster init`, `ftvm cluster issue`): the authority; each host's
credentials (its agent's and etcd member's certificate, naming the host's
address); an operator's (the tests' command line and Python clients).
And what the tests' own clients need to speak to the cluster as an
operator would: etcdctl's flags, an SSL context for urllib, and the pins
that make the browser trust the agents' certificates."""

import base64
import hashlib
import ssl
import subprocess
from pathlib import Path

from .site import Site


class Pki:
    """The credentials of hosts `roles` (their addresses the site's) under
    `work`/credentials."""

    def __init__(self, ftvm, work, roles):
        self.dir = Path(work) / "credentials"
        self.ca = self.dir / "authority"
        self._ftvm(ftvm, "init", self.ca)
        for role in roles:
            self._ftvm(ftvm, "issue", self.ca, self.host(role), "--name", role, "--ip", Site.HOSTS[role][1])
        self.operator = self.dir / "operator"
        self._ftvm(ftvm, "issue", self.ca, self.operator, "--name", "operator")
        self.roles = list(roles)

    @staticmethod
    def _ftvm(ftvm, *args):
        subprocess.run([ftvm, "cluster", *map(str, args)], check=True, capture_output=True, timeout=60)

    def host(self, role):
        """Host `role`'s credentials directory."""
        return self.dir / f"host-{role}"

    @property
    def token(self):
        return (self.operator / "token").read_text().strip()

    def etcdctl(self, creds=None):
        """etcdctl's TLS flags, as the operator (or `creds`)."""
        creds = creds or self.operator
        return ["--cacert", str(creds / "ca.pem"), "--cert", str(creds / "cert.pem"), "--key", str(creds / "key.pem")]

    def ssl_context(self, client_cert=False):
        """An SSL context trusting only the cluster's authority (and, with
        `client_cert`, showing the operator's certificate: etcd asks)."""
        ctx = ssl.create_default_context(cafile=str(self.operator / "ca.pem"))
        if client_cert:
            ctx.load_cert_chain(str(self.operator / "cert.pem"), str(self.operator / "key.pem"))
        return ctx

    def spki_pins(self):
        """The hosts' public keys as chromium's
        --ignore-certificate-errors-spki-list takes them (base64 of the
        SHA-256 of each SubjectPublicKeyInfo): the browser then trusts
        exactly these keys, as a browser told of the cluster's authority
        would trust the certificates it signed."""
        pins = []
        for role in self.roles:
            pem = (self.host(role) / "cert.pem").read_bytes()
            spki = subprocess.run(
                "openssl x509 -pubkey -noout | openssl pkey -pubin -outform der", shell=True,
                input=pem, capture_output=True, check=True).stdout
            pins.append(base64.b64encode(hashlib.sha256(spki).digest()).decode())
        return pins
