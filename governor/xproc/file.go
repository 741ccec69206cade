package xproc

import (
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Who may use a ledger file is decided by the file itself: its mode is
// exactly 0600 (its owner's processes) or exactly 0660 (and its group's
// members). So a file that is not what Create makes is refused before it
// is read or locked: a symbolic link (O_NOFOLLOW), anything but a regular
// file (a FIFO is opened O_NONBLOCK, so it cannot hang the open), a file
// with another name linked to it (whoever can write that name writes the
// ledger), a mode other than 0600 and 0660 (0640 lets the group read
// figures it cannot write, 0060 shuts its owner out; anything beyond 0660
// lets non-members in), a 0660 file of a group other than the one
// configured (CreateOptions.Group when the caller passes Create, one of
// this process's groups otherwise), and a file owned by another user than
// this process's, unless that user is root or the file is 0660 with a
// group this process is in. (Root's processes accept any owner.) Each is a
// *ledgerError of errUnsafe.

// anyGroup is openFile's group for a caller that configured none: a 0660
// file of any of this process's groups.
const anyGroup = -1

// openFile opens the ledger file at path with flag (unix.O_RDWR or
// unix.O_RDONLY) and checks it is safe; group is the group a 0660 file
// must have (anyGroup: one of this process's). A missing file's error
// matches os.ErrNotExist.
func openFile(op, path string, flag int, group int) (*os.File, error) {
	fd, err := unix.Open(path, flag|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	for err == unix.EINTR {
		fd, err = unix.Open(path, flag|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err == unix.ELOOP {
		return nil, ledgerErr(op, path, errUnsafe, "a symbolic link: open the ledger by its own path")
	}
	if err == unix.EISDIR {
		return nil, ledgerErr(op, path, errUnsafe, "not a regular file (a directory)")
	}
	if err != nil {
		return nil, &ledgerError{Op: op, Path: path, Err: &os.PathError{Op: "open", Path: path, Err: err}}
	}
	if err := checkFile(fd, group); err != "" {
		unix.Close(fd)
		return nil, ledgerErr(op, path, errUnsafe, "%s", err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &ledgerError{Op: op, Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkFile says what makes the open file fd unsafe, or "".
func checkFile(fd int, group int) string {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "fstat: " + err.Error()
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG {
		return fmt.Sprintf("not a regular file (%s)", fileType(t))
	}
	if st.Nlink != 1 {
		return fmt.Sprintf("%d names link to it: a ledger has one", st.Nlink)
	}
	perm := st.Mode & 0o7777
	if perm != 0o600 && perm != 0o660 {
		return fmt.Sprintf("mode %#o: a ledger is exactly 0600 or 0660", perm)
	}
	if perm == 0o660 && group != anyGroup && int(st.Gid) != group {
		return fmt.Sprintf("a 0660 file of group %d, configured group %d", st.Gid, group)
	}
	euid := os.Geteuid()
	if euid == 0 || int(st.Uid) == euid || st.Uid == 0 {
		return ""
	}
	if perm == 0o660 && inGroup(int(st.Gid)) {
		return ""
	}
	return fmt.Sprintf("owned by uid %d, gid %d (mode %#o): neither this process's user (%d) nor root, nor a 0660 file of one of its groups",
		st.Uid, st.Gid, perm, euid)
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
