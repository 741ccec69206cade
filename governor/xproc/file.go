package xproc

import (
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Who may use a ledger file is decided by the file itself: its mode is
// 0600 (its owner's processes) or 0660 (and its group's members). So a
// file that is not what Create makes is refused before it is read or
// locked: a symbolic link (O_NOFOLLOW), anything but a regular file (a
// FIFO is opened O_NONBLOCK, so it cannot hang the open), a mode with any
// bit beyond 0660 (non-members could read or write it), and a file owned
// by another user than this process's, unless that user is root or the
// file is 0660 with one of this process's groups. (Root's processes accept
// any owner.) Each is a *LedgerError of ErrUnsafe.

// openFile opens the ledger file at path with flag (unix.O_RDWR or
// unix.O_RDONLY) and checks it is safe. A missing file's error matches
// os.ErrNotExist.
func openFile(op, path string, flag int) (*os.File, error) {
	fd, err := unix.Open(path, flag|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	for err == unix.EINTR {
		fd, err = unix.Open(path, flag|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err == unix.ELOOP {
		return nil, ledgerErr(op, path, ErrUnsafe, "a symbolic link: open the ledger by its own path")
	}
	if err == unix.EISDIR {
		return nil, ledgerErr(op, path, ErrUnsafe, "not a regular file (a directory)")
	}
	if err != nil {
		return nil, &LedgerError{Op: op, Path: path, Err: &os.PathError{Op: "open", Path: path, Err: err}}
	}
	if err := checkFile(fd); err != "" {
		unix.Close(fd)
		return nil, ledgerErr(op, path, ErrUnsafe, "%s", err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &LedgerError{Op: op, Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkFile says what makes the open file fd unsafe, or "".
func checkFile(fd int) string {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "fstat: " + err.Error()
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG {
		return fmt.Sprintf("not a regular file (%s)", fileType(t))
	}
	if perm := st.Mode & 0o7777; perm&^0o660 != 0 {
		return fmt.Sprintf("mode %#o lets non-members in: a ledger is 0600 or 0660", perm)
	}
	euid := os.Geteuid()
	if euid == 0 || int(st.Uid) == euid || st.Uid == 0 {
		return ""
	}
	if st.Mode&0o060 == 0o060 && inGroup(int(st.Gid)) {
		return ""
	}
	return fmt.Sprintf("owned by uid %d, gid %d (mode %#o): neither this process's user (%d) nor root, nor a 0660 file of one of its groups",
		st.Uid, st.Gid, st.Mode&0o777, euid)
}

// inGroup reports whether this process is in group gid.
func inGroup(gid int) bool {
	if os.Getegid() == gid {
		return true
	}
	gs, err := os.Getgroups()
	return err == nil && slices.Contains(gs, gid)
}

func fileType(t uint32) string {
	switch t {
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFLNK:
		return "a symbolic link"
	}
	return fmt.Sprintf("type %#o", t)
}
