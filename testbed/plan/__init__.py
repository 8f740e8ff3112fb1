"""Pure plans: what every port queue, host, switch and pause agent is to be, as plain data and command lists, from a fabric description and a scenario. Nothing here touches the machine."""
