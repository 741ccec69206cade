package simple

type Mechanism struct{}
