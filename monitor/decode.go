package monitor

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"
)

// message is one decoded point of the stream.
type message struct {
	typ pb.MessageType
	// dropped is the sink's count of points dropped so far (it wraps).
	dropped uint32
	// point is the decoded point, nil for a type the monitor only counts.
	point proto.Message
	// cut says the message was longer than the read buffer: point holds
	// only its leading fields that fit.
	cut bool
}

// maxHeader bounds the header size a message may claim: the header may
// grow in later versions (its first field says how long it is), not to the
// whole message.
const maxHeader = 1024

// newPoint returns an empty point of a type the monitor summarises.
func newPoint(t pb.MessageType) proto.Message {
	switch t {
	case pb.MessageType_MESSAGE_CONTAINER_START:
		return &pb.Start{}
	case pb.MessageType_MESSAGE_SENTRY_CLONE:
		return &pb.CloneInfo{}
	case pb.MessageType_MESSAGE_SENTRY_EXEC:
		return &pb.ExecveInfo{}
	case pb.MessageType_MESSAGE_SENTRY_EXIT_NOTIFY_PARENT:
		return &pb.ExitNotifyParentInfo{}
	case pb.MessageType_MESSAGE_SYSCALL_OPEN:
		return &pb.Open{}
	case pb.MessageType_MESSAGE_SYSCALL_CONNECT:
		return &pb.Connect{}
	case pb.MessageType_MESSAGE_SYSCALL_SOCKET:
		return &pb.Socket{}
	case pb.MessageType_MESSAGE_SYSCALL_BIND:
		return &pb.Bind{}
	case pb.MessageType_MESSAGE_SYSCALL_LISTEN:
		return &pb.Listen{}
	case pb.MessageType_MESSAGE_SYSCALL_ACCEPT:
		return &pb.Accept{}
	case pb.MessageType_MESSAGE_SYSCALL_RAW:
		return &pb.Syscall{}
	}
	return nil
}

// decode reads one message of the remote sink's wire format: a wire.Header
// (its own size first), then the point's protobuf. cut says the read
// buffer was too small for it: the leading protobuf fields that are whole
// are decoded (an execve's process, binary and first arguments come first),
// the rest is dropped. An error means the stream is not the sink's.
func decode(b []byte, cut bool) (message, error) {
	if len(b) < wire.HeaderStructSize {
		return message{}, fmt.Errorf("message of %d bytes, shorter than the %d-byte header", len(b), wire.HeaderStructSize)
	}
	var h wire.Header
	h.UnmarshalBytes(b[:wire.HeaderStructSize])
	if int(h.HeaderSize) < wire.HeaderStructSize || int(h.HeaderSize) > maxHeader || int(h.HeaderSize) > len(b) {
		return message{}, fmt.Errorf("message header claims %d bytes of %d", h.HeaderSize, len(b))
	}
	msg := message{typ: pb.MessageType(h.MessageType), dropped: h.DroppedCount, cut: cut}
	if _, known := pb.MessageType_name[int32(msg.typ)]; !known || msg.typ == pb.MessageType_MESSAGE_UNKNOWN {
		return message{}, fmt.Errorf("message of unknown type %d", h.MessageType)
	}
	payload := b[h.HeaderSize:]
	if cut {
		payload = wholeFields(payload)
	}
	msg.point = newPoint(msg.typ)
	if msg.point == nil {
		return msg, nil
	}
	if err := proto.Unmarshal(payload, msg.point); err != nil {
		return message{}, fmt.Errorf("%s message does not decode: %v", kind(msg.typ), err)
	}
	return msg, nil
}

// wholeFields is the prefix of b made of whole top-level protobuf fields.
func wholeFields(b []byte) []byte {
	off := 0
	for off < len(b) {
		_, _, n := protowire.ConsumeField(b[off:])
		if n < 0 {
			break
		}
		off += n
	}
	return b[:off]
}

// kind is a message type's name in Activity.Events: "sentry_exec",
// "open", "connect", ... (the schema's name without its prefixes).
func kind(t pb.MessageType) string {
	name, ok := pb.MessageType_name[int32(t)]
	if !ok {
		return "unknown"
	}
	name = strings.TrimPrefix(name, "MESSAGE_")
	name = strings.TrimPrefix(name, "SYSCALL_")
	return strings.ToLower(name)
}
