// A sarama (Debian's golang-github-shopify-sarama-dev, 1.22) consumer-group member for
// ottla's mixed-group tests on the librdkafka mock.
//
//	sarama_member BOOTSTRAP GROUP TOPIC
//
// It reads TOPIC as a member of GROUP with the range assignor, session 6 s, heartbeats
// every 500 ms and automatic commits every 500 ms (of the offsets it marked: every
// record it printed). Output, for the test to parse:
//   - stdout: `PARTITION OFFSET` per record read;
//   - stderr: `assigned: [P] [P] ...` at each session's start (generation G),
//     `revoked:` at its end, and `error: ...` for every error the group reports.
//
// SIGTERM closes the group (the last commit, then LeaveGroup) and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/Shopify/sarama"
)

type handler struct{}

func (handler) Setup(s sarama.ConsumerGroupSession) error {
	var parts []string
	for _, ps := range s.Claims() {
		sorted := append([]int32(nil), ps...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		for _, p := range sorted {
			parts = append(parts, fmt.Sprintf("[%d]", p))
		}
	}
	fmt.Fprintf(os.Stderr, "generation %d assigned: %s\n", s.GenerationID(), strings.Join(parts, ", "))
	return nil
}

func (handler) Cleanup(s sarama.ConsumerGroupSession) error {
	fmt.Fprintf(os.Stderr, "generation %d revoked:\n", s.GenerationID())
	return nil
}

func (handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		fmt.Fprintf(os.Stdout, "%d %d\n", m.Partition, m.Offset)
		s.MarkMessage(m, "")
	}
	return nil
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: sarama_member BOOTSTRAP GROUP TOPIC")
		os.Exit(2)
	}
	bootstrap, group, topic := os.Args[1], os.Args[2], os.Args[3]
	config := sarama.NewConfig()
	config.ClientID = "sarama"
	config.Version = sarama.V2_0_0_0
	config.Consumer.Return.Errors = true
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	config.Consumer.Offsets.CommitInterval = 500 * time.Millisecond
	config.Consumer.Group.Session.Timeout = 6 * time.Second
	config.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	config.Consumer.Group.Rebalance.Strategy = sarama.BalanceStrategyRange
	config.Consumer.MaxWaitTime = 100 * time.Millisecond
	g, err := sarama.NewConsumerGroup(strings.Split(bootstrap, ","), group, config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
	go func() {
		for err := range g.Errors() {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		cancel()
	}()
	fmt.Fprintln(os.Stderr, "ready")
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{topic}, handler{}); err != nil {
			fmt.Fprintf(os.Stderr, "error: %v\n", err)
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := g.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
	}
}
