#!/usr/bin/env python3
"""Builds and reads Herald's container image as an OCI image archive, without a
container engine (none runs on this project's machines).

  oci-image.py build ROOTFS OUT.tar [--version V] [--revision COMMIT] [--created TIME]
      One layer of ROOTFS (owned by root, times clamped to SOURCE_DATE_EPOCH or 0, so
      the same files give the same digests), a config that runs as the chart's user
      10001:10001 with the Dockerfile's labels and ports, written as an OCI image layout
      in a tar (an "oci-archive": `skopeo copy oci-archive:OUT.tar docker://REGISTRY/herald:V`
      pushes it, `podman load -i OUT.tar` loads it).
  oci-image.py unpack ARCHIVE DEST
      Checks every digest and size from index.json down, unpacks the layer into DEST and
      prints the config's user (exit 1 on a mismatch).
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

USER = "10001:10001"
PORTS = ["8080/tcp", "9090/tcp", "9091/tcp", "9099/tcp"]
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def layer_tar(rootfs, epoch):
    """The uncompressed layer: every file of ROOTFS, sorted, owned by root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for top, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted(dirs + files):
                paths.append(os.path.join(top, name))
        for path in sorted(paths, key=lambda p: os.path.relpath(p, rootfs)):
            info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = min(info.mtime, epoch)
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def blob(blobs, data):
    digest = hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return f"sha256:{digest}"


def build(args):
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    raw = layer_tar(args.rootfs, epoch)
    gz = io.BytesIO()
    # gzip's own default level (6): level 9 takes twice as long for a few percent.
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as z:
        z.write(raw)
    blobs = {}
    labels = {
        "org.opencontainers.image.title": "herald",
        "org.opencontainers.image.description": "Herald: a Redis-backed WebSocket push gateway (gateway, worker, load-test)",
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": args.version,
        "org.opencontainers.image.revision": args.revision,
        "org.opencontainers.image.created": args.created,
        "org.opencontainers.image.source": "https://github.com/herald-im/herald",
    }
    config = {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
        "os": "linux",
        "config": {
            "User": USER,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "WorkingDir": "/",
            "ExposedPorts": {p: {} for p in PORTS},
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
        "history": [{"created_by": "scripts/image.sh: the release binaries and the libraries they load"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": blob(blobs, config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER, "digest": blob(blobs, gz.getvalue()), "size": len(gz.getvalue())}],
        "annotations": {k: v for k, v in labels.items() if v},
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": MANIFEST,
            "digest": blob(blobs, manifest_bytes),
            "size": len(manifest_bytes),
            "annotations": {"org.opencontainers.image.ref.name": args.version},
        }],
    }
    files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
             "index.json": json.dumps(index, sort_keys=True, indent=2).encode()}
    for digest, data in blobs.items():
        files[f"blobs/sha256/{digest}"] = data
    with tarfile.open(args.out, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ["blobs", "blobs/sha256"]:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(info)
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, epoch
            tar.addfile(info, io.BytesIO(files[name]))
    print(f"{args.out}: {manifest['layers'][0]['size']} bytes of layer, manifest {index['manifests'][0]['digest']}")


def unpack(args):
    with tarfile.open(args.archive) as tar:
        def read(name):
            return tar.extractfile(name).read()

        def verified(descriptor):
            data = read(f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}")
            if f"sha256:{hashlib.sha256(data).hexdigest()}" != descriptor["digest"] or len(data) != descriptor["size"]:
                sys.exit(f"{descriptor['digest']}: content does not match its digest or size")
            return data

        index = json.loads(read("index.json"))
        (entry,) = index["manifests"]
        manifest = json.loads(verified(entry))
        config = json.loads(verified(manifest["config"]))
        (layer,) = manifest["layers"]
        raw = gzip.decompress(verified(layer))
        if f"sha256:{hashlib.sha256(raw).hexdigest()}" != config["rootfs"]["diff_ids"][0]:
            sys.exit("the layer does not match the config's diff_id")
        os.makedirs(args.dest, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(raw)) as layer_tar:
            kwargs = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
            layer_tar.extractall(args.dest, **kwargs)  # our own image: modes (1777 /tmp) kept
    print(config["config"]["User"])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("rootfs")
    b.add_argument("out")
    b.add_argument("--version", default="0.1.0")
    b.add_argument("--revision", default="unknown")
    b.add_argument("--created", default="")
    u = sub.add_parser("unpack")
    u.add_argument("archive")
    u.add_argument("dest")
    args = p.parse_args()
    build(args) if args.command == "build" else unpack(args)


if __name__ == "__main__":
    main()
