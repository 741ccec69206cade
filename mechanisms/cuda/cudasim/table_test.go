package cudasim

import "reflect"

func isNilFunc(field any) bool { return reflect.ValueOf(field).Elem().IsNil() }
