package governor

// sameRecord reports whether two grants are issues of one recycled record.
func sameRecord(a, b Grant) bool { return a.g == b.g }
