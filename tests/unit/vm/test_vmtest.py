"""The stock-kernel VM's host runner (scripts/vm/vmtest.py), without root or qemu: the image's
cache key, the time budgets, every command line, the console's condensed lines, the checks
for what a run left, and a hung guest ended by its timeout (a sleeping process stands in
for qemu)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

VMTEST = Path(__file__).resolve().parents[3] / "scripts" / "vm" / "vmtest.py"


def load_vmtest():
    spec = importlib.util.spec_from_file_location("vmtest", VMTEST)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vmtest"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


vm = load_vmtest()

# A stand-in for qemu whose guest never powers off: it prints like a booting kernel, then
# sleeps far past any timeout given here.
HUNG_GUEST = [sys.executable, "-c", "import time\n"
              "print('[    0.000000] Linux version 6.1.0-50-amd64 (debian-kernel@lists) #1',"
              " flush=True)\n"
              "print('[vm-guest] run x: kernel 6.1.0-50-amd64', flush=True)\n"
              "time.sleep(600)\n"]
HUNG_TIMEOUT_S = 2.0
KILL_SECONDS_MAX = 30.0  # the runner waits this long at most after the kill


# --- the cache key ----------------------------------------------------------------------------


def key_of(files: dict[str, str], **config) -> str:
    return vm.cache_key(vm.key_inputs(replace(vm.Config(), **config), files))


FILES = {"requirements.txt": "numpy==2.3.0\n", "requirements-test.txt": "pytest==9.2.0\n",
         "pyproject.toml": "[project]\n", "setup.cfg": "[tool:pytest]\n",
         "setup.py": "setup(packages=[])\n",
         "scripts/install.sh": "APT_PACKAGES=(openvswitch-switch)\n"}


def test_the_key_changes_with_what_the_image_holds_and_nothing_else():
    key = key_of(FILES)
    assert key == key_of(dict(FILES)) and len(key) == 16
    for name, text in FILES.items():  # everything install.sh's stamp covers, and install.sh
        assert key_of({**FILES, name: text + "# changed\n"}) != key, name
    assert key_of(FILES, extras="torch") != key
    assert key_of(FILES, kernel="backports") != key
    assert key_of(FILES, torch_index_url="https://example.invalid/whl") != key
    # what the guest reads at run time comes with the tree, so it builds nothing
    assert key_of(FILES, timeout_s=60.0, smp=4, pytest_args=("-k", "doctor")) == key


def test_the_key_reads_the_stamps_files_from_the_tree(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "README.md").write_text("not part of the image\n")
    config = replace(vm.Config(), root=tmp_path)
    assert [p.name for p in vm.stamp_files(tmp_path)] == [
        "requirements-test.txt", "requirements.txt", "pyproject.toml", "setup.cfg",
        "setup.py", "install.sh"]
    assert vm.cache_key(vm.read_key_inputs(config)) == key_of(FILES)
    inputs = vm.read_key_inputs(config)
    assert inputs["packages"][0] == "linux-image-amd64" and inputs["extras"] == "test"
    assert vm.GUEST_UNIT in inputs.values() and vm.GUEST_ENTRY in inputs.values()


# --- configuration ----------------------------------------------------------------------------


def args(*argv: str):
    return vm.build_parser().parse_args(["run", *argv])


def test_flags_then_environment_then_defaults(tmp_path):
    config = vm.config_from(args("--mirror", "http://m.invalid/debian"), {})
    assert config.timeout_s == 45 * 60 and config.kernel == "stock" and config.smp == 2
    env = {"TESTBED_VM_TIMEOUT_MIN": "30", "TESTBED_VM_KERNEL": "backports",
           "TESTBED_VM_PYTEST_ARGS": "-k 'doctor or bench'", "TESTBED_VM_MIRROR": "http://e/d",
           "TESTBED_VM_DEADLINE": "1700000000"}
    config = vm.config_from(args("--smp", "1"), env)
    assert (config.timeout_s, config.kernel, config.smp) == (1800.0, "backports", 1)
    assert config.pytest_args == ("-k", "doctor or bench")
    assert config.deadline_unix == 1700000000.0 and config.mirror == "http://e/d"
    assert vm.config_from(args("--timeout-min", "10"), env).timeout_s == 600.0
    with pytest.raises(ValueError, match="--timeout-min: expected a number"):
        vm.config_from(args("--timeout-min", "soon"), {})
    with pytest.raises(ValueError, match="--kernel: expected one of stock, backports"):
        vm.config_from(args("--kernel", "mainline"), {})


def test_the_mirror_is_the_one_apt_uses_for_debian_12():
    deb822 = ("Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm "
              "bookworm-updates\nComponents: main\n\n"
              "Types: deb\nURIs: http://mirror.example/debian-security\n"
              "Suites: bookworm-security\nComponents: main\n")
    assert vm.parse_debian_mirror([deb822]) == "http://mirror.example/debian"
    one_line = ("# comment\ndeb-src http://src.example/debian bookworm main\n"
                "deb [arch=amd64] http://one.example/debian bookworm main contrib\n")
    assert vm.parse_debian_mirror([one_line]) == "http://one.example/debian"
    assert vm.parse_debian_mirror(["deb http://x.example/ubuntu jammy main\n"]) is None


# --- time -------------------------------------------------------------------------------------


def test_the_guest_gets_its_timeout_unless_a_deadline_cuts_it():
    assert vm.guest_timeout_s(2700.0, None, 0.0) == (2700.0, None)
    now = 1_000_000.0
    timeout, problem = vm.guest_timeout_s(2700.0, now + 1800.0, now)
    assert timeout == 1800.0 - vm.COLLECT_MARGIN_S and problem is None
    timeout, problem = vm.guest_timeout_s(2700.0, now + 300.0, now)
    assert problem == "the deadline leaves the guest 3.0 min, less than 10"
    assert vm.suite_budget_s(2700.0) == 2700 - vm.GUEST_OVERHEAD_S
    assert vm.suite_budget_s(100.0) == 60  # never nothing: pytest still starts


# --- command lines ----------------------------------------------------------------------------


def test_the_guest_boots_without_a_network_and_off_on_reboot(tmp_path):
    argv = vm.qemu_argv(tmp_path, tmp_path / "o.qcow2", tmp_path / "t.img", tmp_path / "r.img",
                        smp=2, memory_mb=4096)
    assert argv[0] == "qemu-system-x86_64"
    joined = " ".join(argv)
    for words in ("-accel tcg,thread=multi", "-nic none", "-no-reboot", "-nographic",
                  "-smp 2", "-m 4096", f"-kernel {tmp_path}/vmlinuz"):
        assert words in joined, words
    drives = [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]
    assert drives == [f"file={tmp_path}/o.qcow2,format=qcow2,if=virtio",
                      f"file={tmp_path}/t.img,format=raw,if=virtio",
                      f"file={tmp_path}/r.img,format=raw,if=virtio"]
    append = argv[argv.index("-append") + 1].split()
    assert {"root=/dev/vda", "console=ttyS0", "testbed.vmtest=1"} <= set(append)
    console = vm.qemu_argv(tmp_path, tmp_path / "o", tmp_path / "t", tmp_path / "r", 1, 1024,
                           run_suite=False)
    assert "testbed.vmtest=1" not in console[console.index("-append") + 1]


def test_the_image_build_commands(tmp_path):
    root = tmp_path / "rootfs"
    argv = vm.debootstrap_argv(root, "http://m.example/debian")
    assert argv[:2] == ["debootstrap", "--variant=minbase"]
    assert argv[-3:] == ["bookworm", str(root), "http://m.example/debian"]
    assert "linux-image-amd64" in argv[2] and "openvswitch-switch" in argv[2]
    assert [m[1] for m in vm.mount_argvs(root)] == [
        ["mount", "--bind", f"/{sub}", str(root / sub)] for sub in ("proc", "sys", "dev",
                                                                     "dev/pts")]
    assert vm.mkfs_argv(tmp_path / "b.img", "testbed-root", "8G", root) == [
        "mkfs.ext4", "-q", "-F", "-L", "testbed-root", "-d", str(root), str(tmp_path / "b.img"),
        "8G"]
    assert vm.overlay_argv(tmp_path / "b.img", tmp_path / "o.qcow2") == [
        "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
        str((tmp_path / "b.img").resolve()), str(tmp_path / "o.qcow2")]
    assert vm.rdump_argv(tmp_path / "r.img", "out", tmp_path / "res") == [
        "debugfs", "-R", f'rdump /out "{tmp_path}/res"', str(tmp_path / "r.img")]
    assert vm.host_tool_packages(lambda tool: None) == ["debootstrap", "qemu-system-x86",
                                                        "qemu-utils", "e2fsprogs"]
    assert vm.host_tool_packages(lambda tool: "/usr/bin/" + tool) == []
    assert vm.backports_argvs("http://m/debian", "bookworm-backports")[-1][-3:] == [
        "-t", "bookworm-backports", "linux-image-amd64"]


def test_the_chroot_gets_a_clean_environment_and_never_logs_the_machines_values():
    env = vm.chroot_env({"PIP_INDEX_URL": "https://user:secret@index.invalid/simple",
                         "HOME": "/home/me", "SSH_AUTH_SOCK": "/tmp/agent"},
                        {"TESTBED_VENV": "/opt/testbed-venv", "TESTBED_EXTRAS": ""})
    assert env["PIP_INDEX_URL"].endswith("index.invalid/simple")
    assert env["HOME"] == "/root" and "SSH_AUTH_SOCK" not in env
    assert env["TESTBED_VENV"] == "/opt/testbed-venv"
    shown = vm.shown_env(env)
    assert "secret" not in shown and "(and PIP_INDEX_URL from this machine)" in shown
    assert "TESTBED_VENV=/opt/testbed-venv" in shown and "TESTBED_EXTRAS=''" in shown


def test_the_guests_settings_file_reads_back_in_a_shell(tmp_path):
    values = {"TESTBED_VM_RUN_ID": "20260101-000000-vm-abcd",
              "TESTBED_VM_PYTEST_ARGS": "-k 'doctor or bench' '--x=$(id)'",
              "TESTBED_EXTRAS": ""}
    env_file = tmp_path / "run.env"
    env_file.write_text(vm.guest_env_text(values))
    out = subprocess.run(["bash", "-c", f". {env_file}; printf '%s\\n' "
                          "\"$TESTBED_VM_RUN_ID\" \"$TESTBED_VM_PYTEST_ARGS\" "
                          "\"[$TESTBED_EXTRAS]\""], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [values["TESTBED_VM_RUN_ID"],
                                       values["TESTBED_VM_PYTEST_ARGS"], "[]"]


def test_the_tree_disk_holds_what_git_lists(tmp_path):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text("results/\n*.pyc\n")
    (tmp_path / "tracked.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "t"], check=True)
    (tmp_path / "new.py").write_text("y = 2\n")  # untracked, not ignored: goes in
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text("{}")  # ignored: stays out
    (tmp_path / "cache.pyc").write_bytes(b"\0")
    assert vm.tree_files(tmp_path) == [".gitignore", "new.py", "tracked.py"]
    copied = tmp_path / "copy"
    assert vm.copy_tree(tmp_path, vm.tree_files(tmp_path), copied) == sum(
        (tmp_path / n).stat().st_size for n in (".gitignore", "new.py", "tracked.py"))
    assert (copied / "new.py").read_text() == "y = 2\n"
    assert vm.tree_disk_mb(10 * 2**20, 400) == 20 + 1 + vm.TREE_HEADROOM_MB


def test_the_newest_kernel_boots():
    assert vm.newest_kernel(["vmlinuz-6.1.0-50-amd64", "vmlinuz-6.12.33+bpo-amd64",
                             "config-6.1.0-50-amd64"]) == "6.12.33+bpo-amd64"
    assert vm.newest_kernel(["vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-50-amd64"]) == \
        "6.1.0-50-amd64"
    assert vm.newest_kernel([]) is None


def test_files_written_into_the_root_file_system_never_follow_its_symlinks(tmp_path):
    rootfs, outside = tmp_path / "rootfs", tmp_path / "outside.conf"
    (rootfs / "etc").mkdir(parents=True)
    outside.write_text("this machine's own file\n")
    (rootfs / "etc" / "resolv.conf").symlink_to(outside)
    vm.write_into(rootfs, "etc/resolv.conf", b"nameserver 127.0.0.1\n")
    assert outside.read_text() == "this machine's own file\n"
    assert (rootfs / "etc" / "resolv.conf").read_text() == "nameserver 127.0.0.1\n"
    vm.write_guest_files(rootfs)
    assert (rootfs / vm.GUEST_UNIT_LINK).resolve() == Path("/") / vm.GUEST_UNIT_PATH
    assert os.access(rootfs / vm.GUEST_ENTRY_PATH, os.X_OK)


def test_the_guest_unit_runs_once_when_asked_and_powers_off_however_it_ends():
    unit = vm.GUEST_UNIT
    assert "ConditionKernelCommandLine=testbed.vmtest=1" in unit
    assert "SuccessAction=poweroff-force" in unit and "FailureAction=poweroff-force" in unit
    # wanted by multi-user.target, so never ordered after it (that would be a cycle)
    assert "WantedBy=multi-user.target" in unit and "After=multi-user.target" not in unit
    entry = vm.GUEST_ENTRY
    assert "mount -L testbed-results" in entry and "mount -L testbed-tree" in entry
    assert 'echo "$status" > "$out/status"' in entry and "scripts/vm/guest.sh" in entry
    subprocess.run(["sh", "-n", "-c", entry], check=True)


# --- the console ------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "shown"), [
    ("[vm-guest] pytest: exit 0 after 1800 s", "[vm-guest] pytest: exit 0 after 1800 s"),
    ("tests/vm/test_doctor.py::test_the_modules_load PASSED                     [ 15%]",
     "PASSED  tests/vm/test_doctor.py::test_the_modules_load"),
    ("tests/integration/test_pfc_lossless.py::test_pause_frames FAILED   [ 90%]",
     "FAILED  tests/integration/test_pfc_lossless.py::test_pause_frames"),
    ("=================== 12 passed, 1 skipped in 1801.20s (0:30:01) ===================",
     "=================== 12 passed, 1 skipped in 1801.20s (0:30:01) ==================="),
    ("[    0.000000] Linux version 6.1.0-50-amd64 (debian-kernel@lists.debian.org) (gcc)",
     "kernel 6.1.0-50-amd64"),
    ("[  312.1] Kernel panic - not syncing: Attempted to kill init!",
     "[  312.1] Kernel panic - not syncing: Attempted to kill init!"),
    ("[FAILED] Failed to start openvswitch-switch.service", "[FAILED] Failed to start "
     "openvswitch-switch.service"),
    ("[ 1900.2] reboot: Power down", "guest powered off"),
    ("[    1.2] virtio_blk virtio1: [vda] 16777216 512-byte logical blocks", None),
    ("", None),
])
def test_the_terminal_shows_the_console_condensed(line, shown):
    assert vm.condense(vm.clean_line(line)) == shown


def test_escape_sequences_and_carriage_returns_are_cleaned():
    assert vm.clean_line("\x1b[0;32m  OK  \x1b[0m] Started x.\r\n") == "  OK  ] Started x."


# --- what a run leaves ------------------------------------------------------------------------


def test_mounts_and_loop_devices_below_the_cache_are_found(tmp_path):
    cache = tmp_path / "cache"
    mounts = (f"proc {cache}/k.build/rootfs/proc proc rw 0 0\n"
              f"udev {cache}/k.build/rootfs/dev devtmpfs rw 0 0\n"
              f"devpts {cache}/k.build/rootfs/dev/pts devpts rw 0 0\n"
              f"tmpfs {tmp_path}/cache-other tmpfs rw 0 0\n"
              f"x {cache}/with\\040space ext4 rw 0 0\n")
    assert vm.mounts_under(mounts, cache) == [f"{cache}/k.build/rootfs/dev/pts",
                                              f"{cache}/k.build/rootfs/dev",
                                              f"{cache}/k.build/rootfs/proc",
                                              f"{cache}/with space"]
    backing = {"loop0": f"{cache}/runs/r/tree.img\n", "loop1": "/srv/other.img\n"}
    assert vm.loop_devices_on(backing, cache) == ["loop0"]


# --- a hung guest -----------------------------------------------------------------------------


def test_a_hung_guest_is_killed_by_pid_at_its_timeout(tmp_path):
    said = []
    t0 = time.monotonic()
    run = vm.watch_guest(HUNG_GUEST, tmp_path / "console.log", HUNG_TIMEOUT_S, say=said.append,
                         heartbeat_s=3600)
    assert run.timed_out and run.returncode is None
    assert HUNG_TIMEOUT_S <= time.monotonic() - t0 < HUNG_TIMEOUT_S + KILL_SECONDS_MAX
    with pytest.raises(ChildProcessError):  # reaped: neither running nor a zombie
        os.waitpid(run.pid, os.WNOHANG)
    assert not Path(f"/proc/{run.pid}").exists()
    assert "[vm-guest] run x" in (tmp_path / "console.log").read_text()
    assert [line.split("] ", 1)[1] for line in said] == ["kernel 6.1.0-50-amd64",
                                                         "[vm-guest] run x: kernel "
                                                         "6.1.0-50-amd64"]
    assert vm.exit_status(None, run, []) == vm.EXIT_RUN_FAILED


def test_a_guest_that_powers_off_is_not_killed(tmp_path):
    run = vm.watch_guest([sys.executable, "-c", "print('[ 9.9] reboot: Power down')"],
                         tmp_path / "console.log", 60.0, say=lambda line: None)
    assert not run.timed_out and run.returncode == 0
    assert vm.exit_status(0, run, []) == vm.EXIT_OK
    assert vm.exit_status(1, run, []) == vm.EXIT_FAILED
    assert vm.exit_status(124, run, []) == vm.EXIT_RUN_FAILED  # the suite's own budget
    assert vm.exit_status(None, run, []) == vm.EXIT_RUN_FAILED  # no status written
    assert vm.exit_status(0, run, ["mount /x"]) == vm.EXIT_RUN_FAILED  # something left


def test_a_run_whose_guest_hangs_exits_3_with_one_line_saying_so(tmp_path, monkeypatch,
                                                                 capsys):
    """The whole run, every step but the guest stood in for: the timeout kills the sleeping
    "qemu", the run says so in one line, finds nothing left, and exits 3."""
    image = tmp_path / "image"
    image.mkdir()
    monkeypatch.setattr(vm, "ensure_host_tools", lambda log: None)
    monkeypatch.setattr(vm, "image_for", lambda config, log, run_dir: vm.Image(image, {}))
    monkeypatch.setattr(vm, "make_disks", lambda config, disks, image, run_id, budget, log: (
        disks / "tree.img", disks / "results.img", disks / "overlay.qcow2"))
    monkeypatch.setattr(vm, "qemu_argv", lambda *a, **k: HUNG_GUEST)
    monkeypatch.setattr(vm, "run_command", lambda argv, log, *a, **k: None)  # debugfs
    config = replace(vm.Config(), cache_dir=tmp_path / "cache",
                     results_dir=tmp_path / "results", timeout_s=HUNG_TIMEOUT_S)
    code = vm.run(config, vm.Log())
    out = capsys.readouterr().out
    assert code == vm.EXIT_RUN_FAILED
    killed = [line for line in out.splitlines() if "did not finish within" in line]
    assert len(killed) == 1 and "qemu (pid " in killed[0] and ") killed" in killed[0]
    assert "nothing left: no qemu process, mount or loop device" in out
    (run_dir,) = (tmp_path / "results").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["exit"] == 3 and record["guest"]["timed_out"] and record["left"] == []
    assert not (tmp_path / "cache" / "runs" / run_dir.name).exists()  # its disks are gone


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.integration.test_dctcp" name="test_dctcp_queue" time="60">
<failure message="AssertionError: drop-tail median 0.49 of the buffer&#10;assert 0.49 &gt; 0.5">
trace</failure></testcase>
<testcase classname="tests.integration.test_netem" name="test_delay" time="3"/>
<testcase classname="tests.integration.test_rxe" name="test_ping" time="1">
<error message="">fixture rdma0 missing
more</error></testcase>
<testcase classname="tests.integration.test_red" name="test_marks" time="1">
<skipped message="allowlisted"/></testcase>
</testsuite></testsuites>"""


def test_failed_tests_names_each_failure_and_error_with_its_first_line():
    assert vm.failed_tests(JUNIT) == [
        "FAILURE tests.integration.test_dctcp::test_dctcp_queue: "
        "AssertionError: drop-tail median 0.49 of the buffer",
        "ERROR tests.integration.test_rxe::test_ping: fixture rdma0 missing",
    ]


def test_failed_tests_of_a_broken_file_is_empty():
    assert vm.failed_tests("<testsuites><testcase") == []
