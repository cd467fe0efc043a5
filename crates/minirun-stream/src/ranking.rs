//! What a budget above the floor holds first: each thing a run could hold instead of reading
//! it, ranked by the bytes it saves a token per byte it takes, and held in that order while the
//! budget pays for it. A streamed layer's deterministic weights or a streamed head save their
//! own size each token (100%); a whole MoE layer held saves its chosen experts a token
//! (experts per token over experts: 2-3% on the seed's models); an embedding held saves one
//! row a token (well under 1%). An expert cache saves its hit rate times its size, at least
//! what holding as many experts of a whole layer would (a chosen expert is as likely to be in
//! it as in the layer): so what saves less than a whole MoE layer is held only once no
//! layer's experts stream, and otherwise the cache gets the budget.

/// One thing the plan may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Holdable {
    /// Layer `layer`'s deterministic weights (attention, router, shared experts, dense MLP).
    Layer { layer: usize },
    /// Table `table` of the plan's tables (the embedding, the head).
    Table { table: usize },
    /// Every routed expert of MoE layer `layer`.
    Experts { layer: usize },
}

/// A holdable with what holding it costs and saves, and whether the plan holds it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ranked {
    pub what: Holdable,
    /// What it is, in words (`layer 3`, `the head (lm_head.weight)`).
    pub label: String,
    /// Budget bytes holding it takes (its resident bytes, less any buffer streaming it needed).
    pub cost: u64,
    /// Bytes a token reads while it is not held.
    pub saves_per_token: u64,
    /// `saves_per_token` per byte of `cost`, in whole percent: what the ranking orders by.
    pub percent: u64,
    pub held: bool,
}

impl Ranked {
    pub fn new(what: Holdable, label: String, cost: u64, saves_per_token: u64) -> Ranked {
        Ranked {
            what,
            label,
            cost,
            saves_per_token,
            percent: percent(saves_per_token, cost),
            held: false,
        }
    }
}

/// `saves` per `cost` in whole percent, rounded to nearest (a thing that costs nothing ranks
/// first).
pub fn percent(saves: u64, cost: u64) -> u64 {
    match cost {
        0 => u64::MAX,
        c => ((u128::from(saves) * 100 + u128::from(c) / 2) / u128::from(c))
            .try_into()
            .unwrap_or(u64::MAX),
    }
}

/// `items` in the order a budget holds them: by `percent`, most first; among equals, in the
/// order given.
pub fn rank(mut items: Vec<Ranked>) -> Vec<Ranked> {
    items.sort_by_key(|item| std::cmp::Reverse(item.percent));
    items
}

/// Holds, in ranked order, every item not yet held that `spare` still pays for, among those
/// `eligible` allows; returns what is left.
pub fn fill(ranked: &mut [Ranked], mut spare: u64, eligible: impl Fn(&Ranked) -> bool) -> u64 {
    for item in ranked.iter_mut().filter(|i| !i.held) {
        if eligible(item) && item.cost <= spare {
            spare -= item.cost;
            item.held = true;
        }
    }
    spare
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(what: Holdable, cost: u64, saves: u64) -> Ranked {
        Ranked::new(what, format!("{what:?}"), cost, saves)
    }

    #[test]
    fn the_ranking_orders_by_bytes_saved_per_byte_held_ties_in_given_order() {
        let layer = |l, b| item(Holdable::Layer { layer: l }, b, b);
        let ranked = rank(vec![
            item(Holdable::Experts { layer: 1 }, 1000, 25),
            layer(0, 300),
            item(Holdable::Table { table: 0 }, 2000, 1),
            item(Holdable::Table { table: 1 }, 800, 800),
            layer(2, 500),
        ]);
        let order: Vec<Holdable> = ranked.iter().map(|r| r.what).collect();
        assert_eq!(
            order,
            vec![
                Holdable::Layer { layer: 0 },
                Holdable::Table { table: 1 },
                Holdable::Layer { layer: 2 },
                Holdable::Experts { layer: 1 },
                Holdable::Table { table: 0 },
            ]
        );
        let percents: Vec<u64> = ranked.iter().map(|r| r.percent).collect();
        assert_eq!(percents, vec![100, 100, 100, 3, 0]);
    }

    #[test]
    fn a_budget_holds_what_it_pays_for_in_order_skipping_what_does_not_fit() {
        let mut ranked = rank(vec![
            item(Holdable::Layer { layer: 0 }, 300, 300),
            item(Holdable::Table { table: 1 }, 800, 800),
            item(Holdable::Layer { layer: 2 }, 500, 500),
            item(Holdable::Experts { layer: 1 }, 100, 3),
        ]);
        // 300 for layer 0; the table's 800 does not fit the 700 left; layer 2's 500 does; the
        // experts' 100 fits what is left.
        let left = fill(&mut ranked, 1000, |_| true);
        let held: Vec<bool> = ranked.iter().map(|r| r.held).collect();
        assert_eq!(held, vec![true, false, true, true]);
        assert_eq!(left, 100);
        // What is not eligible is passed over and stays for a later fill.
        let mut ranked = rank(vec![item(Holdable::Table { table: 0 }, 10, 0)]);
        assert_eq!(fill(&mut ranked, 50, |_| false), 50);
        assert_eq!(fill(&mut ranked, 50, |_| true), 40);
    }

    #[test]
    fn percent_rounds_and_a_free_item_comes_first() {
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(2, 3), 67);
        assert_eq!(percent(999, 1000), 100);
        assert_eq!(percent(5, 0), u64::MAX);
    }
}
