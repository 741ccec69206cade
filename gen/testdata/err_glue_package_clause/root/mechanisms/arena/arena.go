package arena

type Arena struct{}
